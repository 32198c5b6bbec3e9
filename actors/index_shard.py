"""One shard of a build (a MaxP FAISS index, its BM25 and its units): a shard deployment's replica.

A replica loads its shard from the artifact store in ``__init__`` and verifies the checksums; a
restarted replica (Serve replaces a dead one) reloads its shard from the store rather than from any
in-memory state.

The replica is asynchronous (:class:`IndexShardReplica` over :class:`IndexShardImpl`): searches and
unit fetches run in a worker thread, one at a time (FAISS has its ``index.shard_threads``), while
``check_health`` and ``info`` answer from the event loop at once, so a replica busy with a long
search is never taken for dead. A call its client cancels (a stage deadline) stops waiting at once;
the FAISS call already running finishes in its thread (FAISS cannot be interrupted) and the next
call's work waits for it (the one-at-a-time lock is held in the worker thread); a call cancelled
before its turn never runs. A replica holding ``index.shard_max_pending`` calls refuses one more at
once (:class:`ReplicaBusyError`, retriable: the sharded client asks again after a short backoff,
within the shard's deadline, when this or another replica may have room).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import sys
import threading
import time
from typing import Any

import numpy as np
import ray

from longrag.index.artifacts import ArtifactStore, load_shard, load_shard_chunks, load_shard_lexical
from longrag.index.evidence import scored_evidence
from longrag.index.lexical import LexicalIndexMissing
from longrag.types import Unit, UnitHit


class IndexShardImpl:
    """The actor body, also usable in-process (tests, single-process tools)."""

    def __init__(
        self, store_uri: str, shard_id: int, verify: bool = True, threads: int = 1, search_params: str = "",
        device: str = "cpu", *, cache: bool = False, cache_dir: str | None = None,
    ) -> None:
        """``cache``: the shard's files through the node-local cache (:mod:`longrag.index.shard_cache`,
        ``cache_dir`` or its default): fetched and hashed once per node, the FAISS index memory-mapped."""
        import faiss

        from longrag.index.maxp import check_gpu

        if device not in ("cpu", "cuda"):
            raise ValueError(f"index.device must be 'cpu' or 'cuda', got {device!r}")
        if device == "cuda":
            check_gpu()  # a clear configuration error before any loading, not a crash inside FAISS

        # FAISS defaults to one OpenMP thread per core; several shard actors on a node would
        # oversubscribe it, so each uses the threads it was given.
        faiss.omp_set_num_threads(max(1, threads))
        t0 = time.perf_counter()
        self.store_uri = store_uri
        self.shard_id = shard_id
        store = ArtifactStore.open(store_uri)
        file_cache = None
        if cache:
            from longrag.index.shard_cache import ShardFileCache

            file_cache = ShardFileCache(cache_dir)
        self.cache = file_cache
        self.index, self.units = load_shard(store, shard_id, verify=verify, cache=file_cache)
        if device == "cuda":
            self.index.to_gpu(0)  # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU
        self.index.set_search_params(search_params)
        self.search_params = search_params
        self.chunks = load_shard_chunks(store, shard_id, verify=verify, cache=file_cache)
        self.lexical = load_shard_lexical(store, shard_id, verify=verify, cache=file_cache)  # None: built before hybrid retrieval
        _release_load_buffers()
        self.load_s = time.perf_counter() - t0
        self.loaded_at = time.time()
        self.n_searches = 0

    def search(self, queries: np.ndarray, k: int) -> list[list[UnitHit]]:
        """Top-k units per query, each hit tagged with this shard."""
        self.n_searches += 1
        hits = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        for row in hits:
            for h in row:
                h.shard = self.shard_id
        return hits

    def hybrid_search(self, queries: np.ndarray, texts: list[str], k: int) -> tuple[list[list[UnitHit]], list[list[UnitHit]]]:
        """Per query, this shard's top-k units by MaxP (the vectors) and by BM25 (the texts, MaxP per
        unit over the chunks' BM25 scores): both lists in one call, fused by the client after it has
        merged every shard's (:func:`longrag.index.fusion.fuse`)."""
        if self.lexical is None:
            raise LexicalIndexMissing(f"shard {self.shard_id} of {self.store_uri} has no BM25 index (written before "
                                      "hybrid retrieval): rebuild the index, or search with retrieval.mode=dense")
        if len(texts) != len(queries):
            raise ValueError(f"{len(texts)} query texts for {len(queries)} query vectors")
        dense = self.search(queries, k)
        lexical = [self.index.units_from_scores(self.lexical.scores(t), k) for t in texts]
        for row in lexical:
            for h in row:
                h.shard = self.shard_id
        return dense, lexical

    def search_units(self, query: np.ndarray, k: int, evidence: bool = False) -> tuple[list[UnitHit], list[dict[str, Any]]]:
        """One question's top-k units on this shard with their rows (as :meth:`get_units`; with
        ``evidence``, documents best first for ``query``): the search and the fetch in one call, as
        the client's exact merge keeps only hits some shard returned."""
        hits = self.search(np.asarray(query, dtype=np.float32)[None, :], k)[0]
        vecs = np.repeat(np.asarray(query, dtype=np.float32)[None, :], len(hits), 0) if evidence and hits else None
        return hits, self.get_units([h.unit_id for h in hits], [h.best_chunk_id for h in hits], vecs)

    def get_units(self, unit_ids: list[str], best_chunk_ids: list[str] | None = None,
                  queries: np.ndarray | None = None, evidence: bool = True) -> list[dict[str, Any]]:
        """Unit rows (``Unit.to_row()``: text, titles, doc ids) for ids this shard owns, each with the
        text of its best chunk (``best_chunk_text``) when ``best_chunk_ids`` is given; unknown ids
        raise KeyError. With ``queries`` (one vector per unit id) and ``evidence``, each unit's
        documents come best first by their own best chunk, with their scores (``doc_scores``,
        :func:`longrag.index.evidence.order_by_evidence`) and each chunk's ``(start, end, score)`` in
        the reordered text (``chunk_scores``: what the reader packs by); an empty best chunk id (a unit the graph
        walk found, :func:`longrag.index.graph.expand`) is the unit's best chunk for its query
        (``best_chunk_id`` in the row), or none without ``queries``.
        :meth:`actors.sharded_index.ShardedIndex.retrieve_units` joins them with their hits into
        :class:`longrag.types.RetrievedUnit` records."""
        units = [self.units[u] for u in unit_ids]
        if queries is not None and len(queries) != len(unit_ids):
            raise ValueError(f"{len(queries)} query vectors for {len(unit_ids)} units")
        if queries is not None and evidence:
            scored = [self._by_evidence(u, q) for u, q in zip(units, queries)]
            units = [u for u, _, _ in scored]
        rows = [u.to_row() for u in units]
        if queries is not None and evidence:
            for row, (_, doc_scores, chunk_scores) in zip(rows, scored):
                row["doc_scores"] = doc_scores
                row["chunk_scores"] = chunk_scores
        if best_chunk_ids is not None:
            for i, (row, chunk_id) in enumerate(zip(rows, best_chunk_ids)):
                if not chunk_id and queries is not None:
                    ids, scores = self.index.unit_chunk_scores(queries[i], unit_ids[i])
                    chunk_id = row["best_chunk_id"] = ids[int(np.argmax(scores))] if len(ids) else ""
                row["best_chunk_text"] = self.chunks[chunk_id].text if chunk_id else None
        return rows

    def _by_evidence(self, unit: Unit, query: np.ndarray
                     ) -> tuple[Unit, list[float | None], list[tuple[int, int, float]]]:
        chunk_ids, scores = self.index.unit_chunk_scores(query, unit.unit_id)
        texts = [c.text for c in self.chunks.get_many(chunk_ids)]
        return scored_evidence(unit, texts, scores)

    def info(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "store_uri": self.store_uri,
            "n_chunks": int(self.index.ntotal),
            "n_units": len(self.units),
            "dim": int(self.index.dim),
            "load_s": round(self.load_s, 3),
            "factory": self.index.factory,
            "search_params": self.search_params,
            "device": self.index.device,
            "lexical": self.lexical is not None,
            "rss_bytes": _rss_bytes(),
            "loaded_at": self.loaded_at,
            "searches": self.n_searches,
            "pid": os.getpid(),
            "node": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
        }

    def ping(self) -> bool:
        return True


def _release_load_buffers() -> None:
    """Hand the buffers of loading (file bytes, parquet decoding) back to the OS: without this the
    actor's RSS keeps the loading peak, several times the shard's steady-state size."""
    import gc

    gc.collect()
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except Exception:  # an old pyarrow without release_unused
        pass
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:  # not glibc (musl)
            pass


def _consume(done: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a worker call whose client may have gone (no "exception never retrieved")."""
    if not done.cancelled():
        done.exception()


def _rss_bytes() -> int | None:
    """Resident memory of this process (the shard's footprint, for capacity planning)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # psutil missing or the platform refuses
        return None


class ReplicaBusyError(RuntimeError):
    """A shard replica refused a call at once: it already holds ``max_pending`` calls (running,
    waiting, or abandoned by their clients and still to finish). Retriable: another replica of the
    shard, or a moment later (:class:`actors.sharded_index.ShardedIndex` asks again after a backoff,
    within the shard's deadline, without using up one of its tries)."""


class IndexShardReplica:
    """A shard deployment's replica: :class:`IndexShardImpl`'s work in one worker thread at a time,
    health from the event loop (see the module's docstring).

    The limit is held where the work runs: a ``threading.Lock`` taken inside the worker thread, so a
    call its client cancels keeps the lock until its FAISS call really ends and the next call's work
    cannot start beside it; a call cancelled before its turn passes its turn without running. The
    replica holds at most ``max_pending`` calls (``index.shard_max_pending``, the calls Serve sends it
    at once) counting the abandoned ones still in its queue: one more is refused at once with
    :class:`ReplicaBusyError`, so timeouts under overload cannot pile threads and work behind the
    replica."""

    def __init__(self, *args: Any, max_pending: int = 32, **kwargs: Any) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.impl = self._load(*args, **kwargs)
        self.max_pending = max_pending
        self._work = threading.Lock()  # one FAISS call at a time, taken in the worker thread
        self._count = threading.Lock()  # guards pending (the worker threads decrement it)
        self.pending = 0  # calls held: running, waiting for the lock, or abandoned and not yet past it
        self.busy = 0  # calls whose clients still wait for them

    def _load(self, *args: Any, **kwargs: Any) -> Any:
        return IndexShardImpl(*args, **kwargs)

    async def _run(self, fn: Any, *args: Any) -> Any:
        with self._count:
            if self.pending >= self.max_pending:
                raise ReplicaBusyError(
                    f"shard {getattr(self.impl, 'shard_id', '?')}: this replica holds {self.pending} calls "
                    f"(index.shard_max_pending={self.max_pending}); try another replica or again later")
            self.pending += 1
        abandoned = threading.Event()

        def work() -> Any:
            try:
                with self._work:
                    if abandoned.is_set():  # its client left before its turn: pass the turn
                        return None
                    return fn(*args)
            finally:
                with self._count:
                    self.pending -= 1

        # The worker call is shielded from the client's cancellation: once admitted it always runs
        # (or passes its turn), so the lock and the count are released by the thread that holds them.
        running = asyncio.ensure_future(asyncio.to_thread(work))
        running.add_done_callback(_consume)
        self.busy += 1
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            abandoned.set()
            raise
        finally:
            self.busy -= 1

    async def search(self, queries: np.ndarray, k: int) -> list[list[UnitHit]]:
        return await self._run(self.impl.search, queries, k)

    async def hybrid_search(self, queries: np.ndarray, texts: list[str], k: int) -> tuple[list[list[UnitHit]], list[list[UnitHit]]]:
        return await self._run(self.impl.hybrid_search, queries, texts, k)

    async def get_units(self, unit_ids: list[str], best_chunk_ids: list[str] | None = None,
                        queries: np.ndarray | None = None, evidence: bool = True) -> list[dict[str, Any]]:
        return await self._run(self.impl.get_units, unit_ids, best_chunk_ids, queries, evidence)

    async def search_units(self, query: np.ndarray, k: int, evidence: bool = False) -> tuple[list[UnitHit], list[dict[str, Any]]]:
        return await self._run(self.impl.search_units, query, k, evidence)

    async def info(self) -> dict[str, Any]:
        return {**self.impl.info(), "busy": self.busy, "pending": self.pending}

    async def check_health(self) -> None:
        """Serve's health check: answered from the event loop, also while a search runs."""
