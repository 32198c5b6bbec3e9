"""``InProcessIndex``: the ``Retriever``'s index backend with every shard loaded in its own process.

The single-machine profile (``serve.colocate``): the shards' own search code
(:class:`actors.index_shard.IndexShardImpl`) called in process and merged with MaxP's ``merge_topk``,
the same results as the shard deployments (:class:`serve.index_app.ServeIndex`) without a
round trip per shard and per call. It offers the same backend API (:class:`serve.backend.IndexBackend`:
``manifest``, ``search``, ``retrieve_units``, ``search_units``, ``liveness``, ``retire``, ``release``) and
checks requests as they do (:mod:`longrag.index.queries`); searches run in a worker
thread, so the event loop of the replica that holds it keeps serving (``search_sync`` and
``retrieve_units_sync``: the same in the caller's thread, for benchmarks and jobs).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from actors.index_shard import IndexShardImpl
from actors.sharded_index import ShardedSearchResult
from longrag.index.artifacts import ArtifactStore
from longrag.index.fusion import Fusion, merge_answers
from longrag.index.lexical import require_lexical
from longrag.index.queries import check_queries, check_query
from longrag.types import Coverage, RetrievedUnit, ShardRedundancy, UnitHit

if TYPE_CHECKING:
    from longrag.config import IndexConfig


class InProcessIndex:
    """Every shard of the build at ``index_uri`` in this process (``index_cls`` of the Retriever)."""

    def __init__(self, index_uri: str, config: IndexConfig, *, app_name: str | None = None,
                 holder: str | None = None) -> None:
        self.manifest = ArtifactStore.open(index_uri).read_manifest()
        self.shards = [IndexShardImpl(index_uri, s.shard_id, threads=config.shard_threads,
                                      search_params=config.search_params, device=config.device,
                                      cache=config.shard_cache, cache_dir=config.shard_cache_dir)
                       for s in self.manifest.shards]

    def search_sync(self, queries: np.ndarray, k: int, texts: list[str] | None = None,
                    fusion: Fusion | None = None) -> ShardedSearchResult:
        queries = check_queries(queries, k)
        fusion = fusion or Fusion()
        if texts is not None:
            require_lexical(self.manifest)
        per_shard: list[Any] = []
        shard_ms: dict[int, float] = {}
        for shard in self.shards:
            t0 = time.perf_counter()
            per_shard.append(shard.search(queries, k) if texts is None
                             else shard.hybrid_search(queries, list(texts), max(k, fusion.depth)))
            shard_ms[shard.shard_id] = round((time.perf_counter() - t0) * 1e3, 2)
        hits = merge_answers(per_shard, queries.shape[0], k, fusion if texts is not None else None)
        n = len(self.shards)
        coverage = Coverage(shards=n, answered=n, replicas=self.redundancy())
        return ShardedSearchResult(hits=hits, coverage=coverage, shard_ms=shard_ms)

    def retrieve_units_sync(self, hits: list[UnitHit], query: np.ndarray | None = None,
                            evidence: bool = True) -> list[RetrievedUnit]:
        rows: dict[str, dict[str, Any]] = {}
        for shard in self.shards:
            mine = [h for h in hits if h.shard == shard.shard_id]
            if mine:
                queries = None if query is None else np.repeat(np.asarray(query, np.float32)[None, :], len(mine), 0)
                for row in shard.get_units([h.unit_id for h in mine], [h.best_chunk_id for h in mine], queries,
                                           evidence):
                    rows[row["unit_id"]] = row
        return [RetrievedUnit.from_hit(h, rows.get(h.unit_id)) for h in hits]

    def redundancy(self) -> list[ShardRedundancy]:
        return [ShardRedundancy(shard=s.shard_id, live=1, replicas=1) for s in self.shards]

    async def search(self, queries: np.ndarray, k: int, texts: list[str] | None = None,
                     fusion: Fusion | None = None) -> ShardedSearchResult:
        return await asyncio.to_thread(self.search_sync, queries, k, texts, fusion)

    async def retrieve_units(self, hits: list[UnitHit], query: np.ndarray | None = None,
                             evidence: bool = True) -> list[RetrievedUnit]:
        return await asyncio.to_thread(self.retrieve_units_sync, hits, query, evidence)

    async def search_units(self, query: np.ndarray, k: int, evidence: bool = False
                           ) -> tuple[ShardedSearchResult, list[RetrievedUnit]]:
        """One question's dense top-k with its units (:meth:`actors.sharded_index.ShardedIndex.search_units`)."""
        query = check_query(query, k)

        def both() -> tuple[ShardedSearchResult, list[RetrievedUnit]]:
            res = self.search_sync(query[None, :], k)
            return res, self.retrieve_units_sync(res.hits[0], query if evidence else None)

        return await asyncio.to_thread(both)

    async def liveness(self) -> list[ShardRedundancy]:
        return self.redundancy()  # in this process: alive while it is

    async def retire(self) -> None:
        """A newer build took over (the Retriever has drained this one): as :meth:`release`."""
        await self.release()

    async def release(self) -> None:
        self.shards = []
