"""Scatter/gather over the shards of a build: the exact merge, coverage and failover.

A query batch goes to every shard through its handle (one Serve deployment per shard,
:mod:`serve.index_app`; the deployment's router picks a replica, restarts and spreads them); each
shard answers its own top-k units (MaxP is shard-local because a unit never spans shards) and the
client merges the lists exactly. A call slower than ``timeout_s`` is cancelled (the replica does
not keep it queued) and, like a failed call, tried once more (the router sends it to a replica that
answers); a replica that refuses a call because it is full (``ReplicaBusyError``) is asked again
after a short backoff, within the shard's deadline, so a busy shard of one replica is waited for
rather than dropped. When no try of a shard answers, the result says so (``coverage.answered <
shards``, ``degraded = True``, the shard and its error named) instead of failing the request or
silently dropping the shard; likewise when the units a shard won could not be fetched from it
(``coverage.fetch_errors`` and ``unfetched``). Every result's coverage carries each shard's replica
count ("1 of 2 replicas", :meth:`ShardedIndex.liveness`), so lost redundancy shows even while every
shard answers.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from tenacity import AsyncRetrying, retry_if_exception_type

from longrag.index.fusion import Fusion, merge_answers
from longrag.index.lexical import require_lexical
from longrag.index.manifest import Manifest
from longrag.index.queries import check_queries, check_query
from longrag.types import Coverage, RetrievedUnit, ShardRedundancy, UnitHit

log = logging.getLogger(__name__)


@dataclass
class ShardedSearchResult:
    hits: list[list[UnitHit]]
    coverage: Coverage
    shard_ms: dict[int, float]


class IndexNotReady(RuntimeError):
    """Shards that did not start in time, with the reason (what they ask of the cluster and what it lacks)."""


class ShardUnavailable(RuntimeError):
    def __init__(self, shard: int, errors: list[str]) -> None:
        super().__init__(f"no replica of shard {shard} answered: {'; '.join(errors)}")
        self.shard = shard
        self.errors = errors


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is a shard replica's refusal of a call it has no room for
    (:class:`actors.index_shard.ReplicaBusyError`; Ray's task error wrapping it is one too)."""
    from actors.index_shard import ReplicaBusyError

    return isinstance(exc, ReplicaBusyError) or isinstance(getattr(exc, "cause", None), ReplicaBusyError)


_ERROR_LINE = re.compile(r"^\s*(?:\S+\.)?(\w+(?:Error|Exception|Unavailable)): (.+)$")


def describe_error(exc: BaseException, limit: int = 400) -> str:
    """A one-line cause for a failed replica call: Ray wraps the real error (a checksum mismatch
    in the shard's ``__init__``, say) in long tracebacks; report its innermost ``Type: message``."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    causes = [m for line in text.splitlines() if (m := _ERROR_LINE.match(line))]
    if causes:
        name, msg = causes[-1].groups()
        return f"{type(exc).__name__} ({name}: {msg.strip()})"[:limit]
    return f"{type(exc).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"[:limit]


async def await_response(response: Any, timeout_s: float) -> Any:
    """A handle call's result within ``timeout_s``; past it (or when the caller is cancelled) the call
    is cancelled too: a replica does not keep working, nor keep a queued call, for a client that
    stopped waiting. ``response``: an awaitable with ``cancel()`` (Serve's ``DeploymentResponse``)."""
    try:
        return await asyncio.wait_for(response, timeout_s)
    except (TimeoutError, asyncio.CancelledError):
        response.cancel()
        raise


class ShardedIndex:
    """Client over one handle per shard (``handles[shard].method.remote(*args)``); ``attempts``
    tries per call, each within ``timeout_s``, and a replica's refusal (``ReplicaBusyError``) asked
    again after a backoff within the call's deadline (:meth:`_call`). :meth:`replica_counts` says how
    many replicas each shard has running; this class knows none (the Serve backend reads Serve's,
    :class:`serve.index_app.ServeShards`)."""

    #: The first wait after a replica refused a call (``ReplicaBusyError``); it doubles with each
    #: refusal in a row, up to :attr:`busy_backoff_max_s`.
    busy_backoff_s = 0.05
    busy_backoff_max_s = 1.0

    def __init__(self, handles: list[Any], *, timeout_s: float = 10.0, manifest: Manifest | None = None,
                 attempts: int = 2, replicas: int = 1, fused_fetch_max_units: int = 32) -> None:
        if not handles:
            raise ValueError("a sharded index needs a handle per shard")
        self.handles = handles
        self.fused_fetch_max_units = fused_fetch_max_units  # search_units: shards x k above it fetch the winners only
        self.timeout_s, self.attempts = timeout_s, max(1, attempts)
        self.manifest = manifest  # the build's: whether its shards have BM25 for hybrid searches
        self.counts: list[tuple[int, int]] = [(replicas, replicas)] * len(handles)  # (running, wanted) per shard
        self._read: list[tuple[int, int]] = list(self.counts)  # the platform's counts at the last read
        self._lost: list[set[str]] = [set() for _ in handles]  # replicas' actors a call found gone since then
        self._recount: asyncio.Task | None = None
        self._recounted = float("-inf")  # when the counts were last read after a failover (monotonic)
        self._unexplained = False  # a call failed since then without naming the replica lost

    @property
    def n_shards(self) -> int:
        return len(self.handles)

    def redundancy(self) -> list[ShardRedundancy]:
        return [ShardRedundancy(shard=s, live=live, replicas=n) for s, (live, n) in enumerate(self.counts)]

    async def replica_counts(self) -> list[tuple[int, int]]:
        """``(running, wanted)`` replicas per shard, as the platform reports them."""
        return self.counts

    #: After a failover whose error does not name the replica lost (a timeout, an application error),
    #: the counts are read again at most this often (Serve's health checks of shard replicas run every
    #: 5 s: by then it knows). A ``serve.status()`` read costs ~90 ms idle and ~375 ms (p50) under load
    #: at 8 shards x 4 replicas (python -m jobs.bench serve-status).
    recount_min_s = 5.0

    async def liveness(self) -> list[ShardRedundancy]:
        """Read the replica counts again; every shard's redundancy ("1 of 2")."""
        self._read = list(await self.replica_counts())
        self._lost = [set() for _ in self.handles]
        self.counts = list(self._read)
        return self.redundancy()

    def _note_lost(self, shard: int, exc: BaseException) -> bool:
        """Whether ``exc`` (a failed call's) says which replica of ``shard`` is gone: Ray's
        ``RayActorError`` (its actor died or is unreachable) names the actor; the shard's running
        count then drops by each replica so named, each counted once, until the counts are read again."""
        from ray.exceptions import RayActorError

        actor = getattr(exc, "actor_id", None) if isinstance(exc, RayActorError) else None
        if not actor:
            return False
        self._lost[shard].add(str(actor))
        running, wanted = self._read[shard]
        self.counts[shard] = (max(0, running - len(self._lost[shard])), wanted)
        return True

    async def _recount_later(self) -> None:
        """One read of the counts, ``recount_min_s`` after the last such read at the soonest."""
        await asyncio.sleep(max(0.0, self._recounted + self.recount_min_s - time.monotonic()))
        self._recounted = time.monotonic()
        await self.liveness()

    # ------------------------------------------------------------------ calls
    async def _call(self, shard: int, method: str, *args: Any) -> tuple[Any, int]:
        """Call ``method`` on ``shard``, trying again on failure; returns (result, failovers).

        A try that fails or takes longer than ``timeout_s`` is tried again at once (Serve routes it to
        another replica), ``attempts`` tries in all. A try a replica refuses for want of room
        (``ReplicaBusyError``: it holds ``index.shard_max_pending`` calls) uses up no try: it is tried
        again after a backoff (:attr:`busy_backoff_s`, doubling up to :attr:`busy_backoff_max_s`), by
        when a replica may have room, as long as the call's deadline allows: ``attempts`` x
        ``timeout_s`` (the longest the tries could take anyway) plus a quarter of a try from its
        first try, which also bounds each try. Raises :class:`ShardUnavailable` with every try's error."""
        loop = asyncio.get_running_loop()
        # the tries' own time plus a quarter of one: a try that fails is tried again with its whole
        # timeout (the moments between tries never shorten it); refusals' backoffs spend the slack
        deadline = loop.time() + self.timeout_s * (self.attempts + 0.25)
        errors: list[str] = []
        failed, refused, backoff = 0, 0, 0.0  # tries failed (not refused), refusals in a row, the next wait

        async def once() -> Any:
            nonlocal failed, refused, backoff
            timeout = max(0.001, min(self.timeout_s, deadline - loop.time()))
            try:
                return await await_response(getattr(self.handles[shard], method).remote(*args), timeout)
            except TimeoutError:
                errors.append(f"try {len(errors) + 1}: timed out after {round(timeout, 3)}s")
                self._unexplained = True
                failed, refused, backoff = failed + 1, 0, 0.0
                raise
            except Exception as exc:  # a dead or restarting replica, the shard failed to load, a full replica
                errors.append(f"try {len(errors) + 1}: {describe_error(exc)}")
                if is_busy(exc):  # alive, only full: no replica to count as lost
                    backoff = min(self.busy_backoff_max_s, self.busy_backoff_s * 2 ** refused)
                    refused += 1
                else:
                    if not self._note_lost(shard, exc):
                        self._unexplained = True
                    failed, refused, backoff = failed + 1, 0, 0.0
                raise

        def log_failure(_: Any) -> None:
            log.warning("shard %d %s failed: %s", shard, method, errors[-1])

        try:
            async for attempt in AsyncRetrying(
                    retry=retry_if_exception_type(Exception), reraise=True, after=log_failure,
                    wait=lambda _: backoff,
                    stop=lambda _: failed >= self.attempts or loop.time() + backoff >= deadline):
                with attempt:
                    return await once(), len(errors)
        except Exception:  # the last try's failure (CancelledError, the caller leaving, is not caught)
            raise ShardUnavailable(shard, errors) from None
        raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover

    async def _scatter(self, *call: Any) -> tuple[list[Any], Coverage, dict[int, float]]:
        """``call`` (method, args...) on every shard at once: the answers of those that answered, in
        shard order, the coverage (the others named) and each shard's milliseconds. A call that
        failed on a replica whose error names it (:meth:`_note_lost`) takes it off its shard's count
        at once (this response already shows it); one whose error does not (a timeout) has the
        counts read again in the background, at most every :attr:`recount_min_s`."""

        async def one(shard: int) -> tuple[Any, int, str | None, float]:
            t0 = time.perf_counter()
            try:
                res, failovers = await self._call(shard, *call)
                return res, failovers, None, (time.perf_counter() - t0) * 1e3
            except ShardUnavailable as exc:
                return None, len(exc.errors) - 1, exc.errors[-1], (time.perf_counter() - t0) * 1e3

        outcomes = await asyncio.gather(*(one(s) for s in range(self.n_shards)))
        answers = [res for res, _, error, _ in outcomes if error is None]
        failovers = sum(f for _, f, _, _ in outcomes)
        coverage = Coverage(shards=self.n_shards, answered=len(answers), failovers=failovers,
                            errors={s: e for s, (_, _, e, _) in enumerate(outcomes) if e is not None},
                            replicas=self.redundancy())
        if self._unexplained and (self._recount is None or self._recount.done()):
            self._unexplained = False
            self._recount = asyncio.get_running_loop().create_task(self._recount_later())
        return answers, coverage, {s: round(ms, 2) for s, (_, _, _, ms) in enumerate(outcomes)}

    async def search(self, queries: np.ndarray, k: int, texts: list[str] | None = None,
                     fusion: Fusion | None = None) -> ShardedSearchResult:
        """Exact top-k units per query over every answering shard; with ``texts`` (one per query) the
        hybrid search: each shard's MaxP and BM25 lists in one call, each merged over the shards, then
        fused by reciprocal rank (:func:`longrag.index.fusion.merge_shards`)."""
        queries = check_queries(queries, k)
        fusion = fusion or Fusion()
        if texts is not None:
            if self.manifest is not None:
                require_lexical(self.manifest)
            call: tuple[Any, ...] = ("hybrid_search", queries, list(texts), max(k, fusion.depth))
        else:
            call = ("search", queries, k)
        per_shard, coverage, shard_ms = await self._scatter(*call)
        hits = merge_answers(per_shard, queries.shape[0], k, fusion if texts is not None else None)
        return ShardedSearchResult(hits=hits, coverage=coverage, shard_ms=shard_ms)

    async def search_units(self, query: np.ndarray, k: int, evidence: bool = False
                           ) -> tuple[ShardedSearchResult, list[RetrievedUnit]]:
        """One question's dense top-k units with their records. While shards x ``k`` is at most
        ``fused_fetch_max_units``, in one call per shard (a shard sends its own top-k rows; the exact
        merge keeps only hits a shard sent): half the shard calls of :meth:`search` +
        :meth:`retrieve_units`. Above it, ids and scores first and then only the ``k`` units that
        won: with units of ~4K tokens, 8 shards at k = 100 would otherwise ship 800 units to keep
        100; a shard whose winners could not be fetched then is named in the coverage
        (``fetch_errors``; its units, without text, in ``unfetched``), which makes it ``degraded``.
        With ``evidence`` each unit's documents come best first."""
        query = check_query(query, k)
        if self.n_shards * k > self.fused_fetch_max_units:
            result = await self.search(query[None, :], k)
            hits = result.hits[0]
            rows, failed = await self._fetch_rows(
                hits, None if not evidence else np.repeat(query[None, :], len(hits), 0), evidence)
            result.coverage = result.coverage.with_fetch_errors(failed, [h.unit_id for h in hits if h.shard in failed])
            return result, [RetrievedUnit.from_hit(h, rows.get(h.unit_id)) for h in hits]
        answers, coverage, shard_ms = await self._scatter("search_units", query, k, evidence)
        hits = merge_answers([[shard_hits] for shard_hits, _ in answers], 1, k, None)
        rows = {row["unit_id"]: row for _, shard_rows in answers for row in shard_rows}
        result = ShardedSearchResult(hits=hits, coverage=coverage, shard_ms=shard_ms)
        return result, [RetrievedUnit.from_hit(h, rows.get(h.unit_id)) for h in hits[0]]

    async def fetch_units(self, hits: list[UnitHit], queries: np.ndarray | None = None,
                          evidence: bool = True) -> dict[str, dict[str, Any]]:
        """Unit rows for hits (``unit_id`` -> ``Unit.to_row()`` plus ``best_chunk_text``), asking
        each owning shard once (with a second try); units of a shard that could not be asked are
        missing (logged; :meth:`search_units` also names them in its coverage). With ``queries`` (one
        vector per hit) each unit's documents come best first
        (:meth:`actors.index_shard.IndexShardImpl.get_units`): the rows are keyed by unit, so the hits
        must name each unit once (one question's hits); ``evidence=False`` keeps the stored order and
        uses ``queries`` only to pick the best chunk of hits without one (found by the graph walk)."""
        return (await self._fetch_rows(hits, queries, evidence))[0]

    async def _fetch_rows(self, hits: list[UnitHit], queries: np.ndarray | None = None, evidence: bool = True
                          ) -> tuple[dict[str, dict[str, Any]], dict[int, str]]:
        """:meth:`fetch_units`'s rows, and ``{shard: why}`` for each shard whose units could not be fetched."""
        if queries is not None and len({h.unit_id for h in hits}) < len(hits):
            raise ValueError("a unit appears twice among the hits: fetch one question's hits at a time when "
                             "ordering documents by evidence")
        by_shard: dict[int, tuple[list[str], list[str], list[int]]] = {}
        for i, h in enumerate(hits):
            ids, chunk_ids, rows = by_shard.setdefault(h.shard, ([], [], []))
            ids.append(h.unit_id)
            chunk_ids.append(h.best_chunk_id)
            rows.append(i)
        results = await asyncio.gather(
            *(self._call(s, "get_units", ids, chunk_ids, None if queries is None else queries[rows], evidence)
              for s, (ids, chunk_ids, rows) in by_shard.items()),
            return_exceptions=True,
        )
        out: dict[str, dict[str, Any]] = {}
        failed: dict[int, str] = {}
        for (shard, (ids, _, _)), res in zip(by_shard.items(), results):
            if isinstance(res, BaseException):
                log.warning("could not fetch %d units from shard %d: %s", len(ids), shard, res)
                failed[shard] = (res.errors[-1] if isinstance(res, ShardUnavailable) and res.errors
                                 else describe_error(res))
                continue
            for row in res[0]:
                out[row["unit_id"]] = row
        return out, failed

    async def retrieve_units(self, hits: list[UnitHit], query: np.ndarray | None = None,
                             evidence: bool = True) -> list[RetrievedUnit]:
        """The hits joined with their unit records, in rank order (a unit whose shard could not
        be asked has no text: see :class:`longrag.types.RetrievedUnit`); with the ``query`` vector,
        each unit's documents best first (``evidence``) and a best chunk for hits without one."""
        rows = await self.fetch_units(hits, None if query is None else np.repeat(query[None, :], len(hits), 0),
                                      evidence)
        return [RetrievedUnit.from_hit(h, rows.get(h.unit_id)) for h in hits]

    async def infos(self) -> list[dict[str, Any]]:
        """Each shard's ``info()`` (from one of its replicas): size, memory, node."""
        return [res for res, _ in await asyncio.gather(*(self._call(s, "info") for s in range(self.n_shards)))]

    # Sync wrappers for drivers and jobs (not for use inside a running event loop).
    def search_sync(self, queries: np.ndarray, k: int, texts: list[str] | None = None,
                    fusion: Fusion | None = None) -> ShardedSearchResult:
        return asyncio.run(self.search(queries, k, texts, fusion))

    def fetch_units_sync(self, hits: list[UnitHit], queries: np.ndarray | None = None,
                         evidence: bool = True) -> dict[str, dict[str, Any]]:
        return asyncio.run(self.fetch_units(hits, queries, evidence))
