"""Scatter/gather over ``IndexShard`` actors with replicas, failover and coverage.

A query batch goes to one replica of every shard; each shard answers its own top-k units (MaxP is
shard-local because a unit never spans shards) and the client merges the lists exactly. A replica
that is dead, restarting or slower than ``timeout_s`` (the call is then cancelled, not left queued)
or whose queue is full (``max_pending`` calls from this client: Ray refuses the call at once) is
skipped for the next replica of the same shard. When no replica of a shard answers, the result
says so (``coverage.answered < shards``, ``degraded = True``) instead of failing the request or silently dropping the shard.

Each replica's liveness is remembered: a replica whose call failed is not live (tried after the
live ones, so a dead replica costs one failover, not one per request) until it answers a call or a
ping (:meth:`ShardedIndex.liveness`, run by the Retriever's health check); every result's coverage
says how many replicas of each shard are live (``coverage.replicas``, "1 of 2"), so lost redundancy
shows even while every shard answers.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from actors.index_shard import IndexShard
from longrag.index.manifest import Manifest
from longrag.index.fusion import Fusion, merge_answers
from longrag.index.lexical import require_lexical
from longrag.index.placement import ShardPlacement, describe_ask, shard_actor_resources
from longrag.index.artifacts import ArtifactStore
from longrag.types import Coverage, RetrievedUnit, ShardRedundancy, UnitHit

if TYPE_CHECKING:
    from longrag.config import IndexConfig

log = logging.getLogger(__name__)


@dataclass
class ShardedSearchResult:
    hits: list[list[UnitHit]]
    coverage: Coverage
    shard_ms: dict[int, float]


class IndexNotReady(RuntimeError):
    """Shard actors that did not load in time, with what they ask of the cluster and what it has."""


class ShardUnavailable(RuntimeError):
    def __init__(self, shard: int, errors: list[str]) -> None:
        super().__init__(f"no replica of shard {shard} answered: {'; '.join(errors)}")
        self.shard = shard
        self.errors = errors


def shard_actor_name(prefix: str, shard_id: int, replica: int) -> str:
    return f"{prefix}-s{shard_id}-r{replica}"


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


async def _await_ref(ref: Any, timeout_s: float) -> Any:
    """The call's result within ``timeout_s``; past it the call is cancelled too (a replica does not
    keep working, nor keep a queued call, for a client that stopped waiting). ``ref``: an actor
    call's ObjectRef, or a Serve ``DeploymentResponse`` (the shards as Serve deployments)."""
    if not hasattr(ref, "future"):  # a DeploymentResponse: awaitable, cancelled by its own cancel()
        try:
            return await asyncio.wait_for(ref, timeout_s)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            ref.cancel()
            raise
    try:
        return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        ray.cancel(ref)
        raise


def launch_settings(config: "IndexConfig") -> dict[str, Any]:
    """:meth:`ShardedIndex.launch` keywords from the ``index`` config (also an index tier's identity)."""
    return {"replicas": config.replicas, "num_cpus": config.shard_num_cpus, "search_params": config.search_params,
            "threads": config.shard_threads, "node_resource": config.node_resource,
            "memory_factor": config.shard_memory_factor, "device": config.device,
            "num_gpus": config.shard_num_gpus, "max_pending": config.shard_max_pending}


def placement_of(launch: dict[str, Any]) -> ShardPlacement:
    """The placement part of :func:`launch_settings`."""
    return ShardPlacement(**{k: launch[k] for k in ("num_cpus", "node_resource", "memory_factor", "device",
                                                     "num_gpus") if k in launch})


def actor_ask(manifest: Manifest, placement: ShardPlacement) -> dict[str, float]:
    """What the actor of the build's largest shard asks of Ray (for the not-ready diagnostics)."""
    asks = [describe_ask(shard_actor_resources(placement, s)) for s in manifest.shards]
    return max(asks, key=lambda a: a.get("memory_gib", 0.0)) if asks else {}


class ShardedIndex:
    """Client over ``replicas[shard][replica]`` actor handles."""

    def __init__(
        self, replicas: list[list[Any]], *, timeout_s: float = 10.0, actor_resources: dict[str, float] | None = None,
        manifest: Manifest | None = None,
    ) -> None:
        if not replicas or any(not r for r in replicas):
            raise ValueError("every shard needs at least one replica actor")
        self.replicas = replicas
        self.timeout_s = timeout_s
        self.actor_resources = actor_resources  # what each shard actor asks of Ray (for diagnostics)
        self.manifest = manifest  # the build's (launch sets it): whether its shards have BM25 for hybrid searches
        self._next = [0] * len(replicas)
        # [shard][replica]: answered its last call or ping (launched replicas count as live until then)
        self.live: list[list[bool]] = [[True] * len(row) for row in replicas]

    def replace_replicas(self, replicas: list[list[Any]], live: list[list[bool]] | None = None) -> None:
        """New handles for the same shards (re-created replicas, see
        :meth:`actors.index_tier.TieredIndex.repair`), with their liveness (default: not live until
        they answer)."""
        if len(replicas) != len(self.replicas) or any(not r for r in replicas):
            raise ValueError(f"expected handles for {len(self.replicas)} shards, got {len(replicas)}")
        self.replicas = replicas
        self.live = live or [[False] * len(row) for row in replicas]

    def redundancy(self) -> list[ShardRedundancy]:
        return [ShardRedundancy(shard=s, live=sum(row), replicas=len(row)) for s, row in enumerate(self.live)]

    # ------------------------------------------------------------------ launch
    @classmethod
    def launch(
        cls,
        store_uri: str,
        *,
        replicas: int = 1,
        num_cpus: float = 0.25,
        timeout_s: float = 10.0,
        name_prefix: str | None = None,
        namespace: str | None = None,
        detached: bool = False,
        verify: bool = True,
        search_params: str = "",
        threads: int = 1,
        node_resource: str | None = None,
        memory_factor: float = 0.0,
        device: str = "cpu",
        num_gpus: float = 1.0,
        max_pending: int = 32,
    ) -> "ShardedIndex":
        """Start (or, with ``name_prefix``, find) ``replicas`` actors for every shard of a build.

        Named actors (``name_prefix``, in ``namespace`` or the caller's) are shared: whoever
        launches with the same prefix gets the same actors (``get_if_exists``) instead of loading
        its own copy (see :mod:`actors.index_tier`). Replicas of a shard are spread over nodes
        where Ray can (SPREAD is best effort: with fewer nodes than replicas, or the other nodes
        full, two replicas of a shard share a node, and that node's loss takes both). Each actor asks for what
        :func:`longrag.index.placement.shard_actor_resources` gives: the index nodes' custom
        resource (``node_resource``), memory from its shard's size (``memory_factor``) and, with
        ``device="cuda"``, ``num_gpus`` GPUs (the actor then searches on its GPU). A handle queues at
        most ``max_pending`` calls at one replica (Ray's ``max_pending_calls``)."""
        placement = ShardPlacement(num_cpus=num_cpus, node_resource=node_resource, memory_factor=memory_factor,
                                   device=device, num_gpus=num_gpus)
        manifest = ArtifactStore.open(store_uri).read_manifest()
        handles: list[list[Any]] = []
        for shard in manifest.shards:
            row = []
            ask = shard_actor_resources(placement, shard)
            for r in range(replicas):
                opts: dict[str, Any] = {**ask, "scheduling_strategy": "SPREAD", "max_pending_calls": max_pending}
                if name_prefix:
                    opts.update(name=shard_actor_name(name_prefix, shard.shard_id, r), get_if_exists=True)
                    if namespace:
                        opts["namespace"] = namespace
                if detached:
                    opts["lifetime"] = "detached"
                row.append(IndexShard.options(**opts).remote(store_uri, shard.shard_id, verify, threads, search_params,
                                                             device))
            handles.append(row)
        return cls(handles, timeout_s=timeout_s, actor_resources=actor_ask(manifest, placement), manifest=manifest)

    @property
    def n_shards(self) -> int:
        return len(self.replicas)

    def wait_ready(self, timeout_s: float = 300.0, warn_every_s: float = 30.0) -> list[dict[str, Any]]:
        """Block until every replica has loaded its shard; returns their ``info()``.

        A replica that failed to load raises its error. Replicas still pending are logged every
        ``warn_every_s`` and, after ``timeout_s``, raise :class:`IndexNotReady` naming them, the
        resources each asks for and the cluster's total and free resources (an actor that cannot
        be scheduled waits silently in Ray otherwise)."""
        where = [(s, r) for s, row in enumerate(self.replicas) for r in range(len(row))]
        refs = [a.info.remote() for row in self.replicas for a in row]
        index_of = {ref: i for i, ref in enumerate(refs)}
        results: dict[int, dict[str, Any]] = {}
        pending = list(refs)
        t0 = time.monotonic()
        while pending:
            left = timeout_s - (time.monotonic() - t0)
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=max(0.0, min(warn_every_s, left)))
            for ref in ready:
                results[index_of[ref]] = ray.get(ref)  # raises when the shard failed to load
            if not pending:
                break
            message = self._not_ready_message([where[index_of[ref]] for ref in pending], time.monotonic() - t0)
            if time.monotonic() - t0 >= timeout_s:
                raise IndexNotReady(message)
            log.warning(message)
        return [results[i] for i in range(len(refs))]

    def _not_ready_message(self, pending: list[tuple[int, int]], waited_s: float) -> str:
        names = ", ".join(f"shard {s} replica {r}" for s, r in pending[:8]) + (" ..." if len(pending) > 8 else "")
        total = {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
        free = {k: round(v, 3) for k, v in ray.available_resources().items() if not k.startswith("node:")}
        ask = self.actor_resources or "unknown"
        return (
            f"{len(pending)} of {sum(len(row) for row in self.replicas)} IndexShard actors not ready after "
            f"{waited_s:.0f}s ({names}). Each asks for {ask}; the cluster has {total} in total and {free} free. "
            "An actor waits to be scheduled while no node has its ask free: lower index.shard_num_cpus or "
            "index.replicas, give Ray more CPUs (ray start --num-cpus), add nodes that offer index.node_resource "
            "(and a GPU for index.device=cuda), or lower index.shard_memory_factor."
        )

    async def liveness(self, timeout_s: float = 5.0) -> list[list[bool]]:
        """``[shard][replica]``: whether each replica actor answers a ping within ``timeout_s``."""

        async def alive(actor: Any) -> bool:
            try:
                return bool(await _await_ref(actor.ping.remote(), timeout_s))
            except Exception:  # dead, restarting, still loading, or too slow: not live now
                return False

        replicas = self.replicas
        flags = await asyncio.gather(*(alive(a) for row in replicas for a in row))
        out, i = [], 0
        for row in replicas:
            out.append(list(flags[i:i + len(row)]))
            i += len(row)
        if replicas is self.replicas:  # not replaced meanwhile
            self.live = [list(row) for row in out]
        return out

    def kill(self) -> None:
        for row in self.replicas:
            for actor in row:
                ray.kill(actor, no_restart=True)

    # ------------------------------------------------------------------ calls
    async def _call(self, shard: int, method: str, *args: Any) -> tuple[Any, int]:
        """Call ``method`` on one replica of ``shard``, failing over; returns (result, failovers)."""
        row, live = self.replicas[shard], self.live[shard]
        start = self._next[shard] % len(row)
        self._next[shard] += 1
        # round robin over the live replicas first; those whose last call failed come last
        order = sorted(range(len(row)), key=lambda r: (not live[r], (r - start) % len(row)))
        errors: list[str] = []
        for r in order:
            try:
                result = await _await_ref(getattr(row[r], method).remote(*args), self.timeout_s)
                live[r] = True
                return result, len(errors)
            except asyncio.TimeoutError:
                errors.append(f"replica {r}: timed out after {self.timeout_s}s")
            except Exception as exc:  # dead/restarting actor, or the shard failed to load
                errors.append(f"replica {r}: {describe_error(exc)}")
            live[r] = False
            log.warning("shard %d %s failed: %s", shard, method, errors[-1])
        raise ShardUnavailable(shard, errors)

    async def search(self, queries: np.ndarray, k: int, texts: list[str] | None = None,
                     fusion: Fusion | None = None) -> ShardedSearchResult:
        """Exact top-k units per query over every answering shard; with ``texts`` (one per query) the
        hybrid search: each shard's MaxP and BM25 lists in one call, each merged over the shards, then
        fused by reciprocal rank (:func:`longrag.index.fusion.merge_shards`)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2:
            raise ValueError(f"queries must be 2-D (n, dim), got shape {queries.shape}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        fusion = fusion or Fusion()
        if texts is not None:
            if self.manifest is not None:
                require_lexical(self.manifest)
            call: tuple[Any, ...] = ("hybrid_search", queries, list(texts), max(k, fusion.depth))
        else:
            call = ("search", queries, k)

        async def one(shard: int) -> tuple[int, Any, float]:
            t0 = time.perf_counter()
            try:
                res, failovers = await self._call(shard, *call)
                return shard, (res, failovers, None), (time.perf_counter() - t0) * 1e3
            except ShardUnavailable as exc:
                return shard, (None, len(exc.errors), exc.errors[-1]), (time.perf_counter() - t0) * 1e3

        outcomes = await asyncio.gather(*(one(s) for s in range(self.n_shards)))
        per_shard: list[list[list[UnitHit]]] = []
        shard_ms: dict[int, float] = {}
        errors: dict[int, str] = {}
        total_failovers = 0
        for shard, (res, failovers, error), ms in outcomes:
            shard_ms[shard] = round(ms, 2)
            total_failovers += failovers if res is not None else max(failovers - 1, 0)
            if res is None:
                errors[shard] = error
                continue
            per_shard.append(res)
        coverage = Coverage(shards=self.n_shards, answered=len(per_shard), errors=errors, failovers=total_failovers,
                            replicas=self.redundancy())
        hits = merge_answers(per_shard, queries.shape[0], k, fusion if texts is not None else None)
        return ShardedSearchResult(hits=hits, coverage=coverage, shard_ms=shard_ms)

    async def fetch_units(self, hits: list[UnitHit], queries: np.ndarray | None = None) -> dict[str, dict[str, Any]]:
        """Unit rows for hits (``unit_id`` -> ``Unit.to_row()`` plus ``best_chunk_text``), asking
        each owning shard once (with failover); units of a shard that could not be asked are missing.
        With ``queries`` (one vector per hit) each unit's documents come best first
        (:meth:`actors.index_shard.IndexShardImpl.get_units`): the rows are keyed by unit, so the hits
        must name each unit once (one question's hits)."""
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
            *(self._call(s, "get_units", ids, chunk_ids, None if queries is None else queries[rows])
              for s, (ids, chunk_ids, rows) in by_shard.items()),
            return_exceptions=True,
        )
        out: dict[str, dict[str, Any]] = {}
        for (shard, (ids, _, _)), res in zip(by_shard.items(), results):
            if isinstance(res, BaseException):
                log.warning("could not fetch %d units from shard %d: %s", len(ids), shard, res)
                continue
            for row in res[0]:
                out[row["unit_id"]] = row
        return out

    async def retrieve_units(self, hits: list[UnitHit], query: np.ndarray | None = None) -> list[RetrievedUnit]:
        """The hits joined with their unit records, in rank order (a unit whose shard could not
        be asked has no text: see :class:`longrag.types.RetrievedUnit`); with the ``query`` vector,
        each unit's documents best first."""
        rows = await self.fetch_units(hits, None if query is None else np.repeat(query[None, :], len(hits), 0))
        return [RetrievedUnit.from_hit(h, rows.get(h.unit_id)) for h in hits]

    # Sync wrappers for drivers and jobs (not for use inside a running event loop).
    def search_sync(self, queries: np.ndarray, k: int, texts: list[str] | None = None,
                    fusion: Fusion | None = None) -> ShardedSearchResult:
        return asyncio.run(self.search(queries, k, texts, fusion))

    def fetch_units_sync(self, hits: list[UnitHit], queries: np.ndarray | None = None) -> dict[str, dict[str, Any]]:
        return asyncio.run(self.fetch_units(hits, queries))
