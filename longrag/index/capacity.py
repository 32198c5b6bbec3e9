"""Capacity planning for the sharded MaxP index: what a shard costs in memory and how a corpus is
cut into shards and nodes.

* :func:`projected_bytes_per_vector` gives a FAISS factory's bytes per vector from its code size,
  without training it.
* :class:`CapacityModel` predicts a shard actor's resident memory from its chunk count, the
  factory's bytes per vector and the bytes each chunk's text and ids take once loaded, plus a
  fixed process baseline; ``jobs.bench index`` fits those constants on one machine and checks the
  prediction against shard actors on a simulated multi-node Ray cluster.
* :func:`plan_corpus` turns a corpus size into shards and nodes for a memory budget;
  :func:`plan_factories` does so per factory, with the scan cost measured by :func:`scan_cost`.

The measurements behind the model are in :mod:`lab.tradeoff` and
:mod:`lab.synthetic.vectors`. No Ray here; FAISS and numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

from longrag.index.factories import exhaustive


def projected_bytes_per_vector(factory: str, dim: int) -> float:
    """Bytes per vector of a FAISS factory at ``dim`` dims and scale, without training it: the code
    size, plus 8 bytes of id per vector in IVF lists, plus HNSW's neighbour links (2M int32 on level
    0, ~1/M of that again on the upper levels). Centroids and other fixed costs are left out (they
    vanish per vector at millions of vectors). Raises ValueError for a factory FAISS rejects."""
    try:
        index = faiss.index_factory(dim, factory)
    except RuntimeError as e:
        raise ValueError(f"FAISS cannot build {factory!r} at {dim} dims: {e}") from e
    refine = faiss.downcast_index(index)
    if isinstance(refine, faiss.IndexRefine):  # RFlat / Refine(...): the compressed codes + the re-ranking codes
        base, _, _ = factory.rpartition(",")
        return projected_bytes_per_vector(base, dim) + float(faiss.downcast_index(refine.refine_index).code_size)
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        ivf = None
    if ivf is not None:
        return float(ivf.code_size + 8)
    concrete = faiss.downcast_index(index)  # keep ``index`` alive: it owns the C++ object
    if isinstance(concrete, faiss.IndexHNSW):
        storage = faiss.downcast_index(concrete.storage)
        links0 = concrete.hnsw.nb_neighbors(0)  # 2M
        return float(storage.code_size + 4 * links0 * (1 + 2 / links0))
    code_size = getattr(concrete, "code_size", None)
    if code_size is None:
        raise ValueError(f"cannot tell the code size of {factory!r}")
    return float(code_size)


#: What one shard's build task (:func:`actors.build.build_from_staging`) holds at its peak, per chunk:
#: the staged parts' vector column, the float32 array FAISS is given, the index's own codes and its
#: serialized files (4 copies of a Flat vector; fewer bytes for a compressed factory's codes, but
#: the float32 input is there either way), and the chunk text as the staged arrow column, the
#: ``Chunk`` records, the chunks parquet and the BM25 tokens (~12x its UTF-8 bytes); plus the
#: worker's baseline (Python, pyarrow, FAISS, bm25s). Checked against the measured peak by
#: ``python -m jobs.bench shard-load --build`` (docs/benchmarks.md).
BUILD_BASE_BYTES = 400 * 2**20
BUILD_VECTOR_COPIES = 4
BUILD_TEXT_FACTOR = 12


def shard_build_bytes(n_chunks: int, dim: int, text_bytes: int) -> int:
    """The memory to declare for one shard's build task (Ray's ``memory=``), from the chunks staged
    for it: parallel shard builds then never put more on a node than it has."""
    if n_chunks < 0 or dim < 1 or text_bytes < 0:
        raise ValueError(f"n_chunks >= 0, dim >= 1, text_bytes >= 0; got {n_chunks}, {dim}, {text_bytes}")
    return int(BUILD_BASE_BYTES + n_chunks * dim * 4 * BUILD_VECTOR_COPIES + text_bytes * BUILD_TEXT_FACTOR)


@dataclass(frozen=True)
class CapacityModel:
    """RSS of a shard actor ≈ ``base_bytes + n_chunks · (vector_bytes + chunk_bytes)``.

    ``vector_bytes`` is the factory's bytes per vector
    (:func:`lab.tradeoff.index_bytes_per_vector`, ~4·dim for Flat); ``chunk_bytes`` is what
    one chunk's text, ids and unit share cost in memory once loaded (measured: it scales with the
    chunk's text length); ``base_bytes`` is the process baseline (Python, FAISS, pyarrow, Ray
    worker)."""

    base_bytes: float
    chunk_bytes: float

    def shard_rss(self, n_chunks: int, vector_bytes: float) -> float:
        return self.base_bytes + n_chunks * (vector_bytes + self.chunk_bytes)

    @classmethod
    def fit(cls, n_chunks: Sequence[int], rss: Sequence[float], vector_bytes: float) -> CapacityModel:
        """Least-squares fit of base and per-chunk bytes from (chunks, RSS) measurements of shards
        with the same factory (at least two distinct chunk counts)."""
        n = np.asarray(n_chunks, dtype=np.float64)
        y = np.asarray(rss, dtype=np.float64)
        if len(n) != len(y) or len(set(n.tolist())) < 2:
            raise ValueError("fit needs measurements at two or more distinct chunk counts")
        slope, intercept = np.polyfit(n, y, 1)
        return cls(base_bytes=float(intercept), chunk_bytes=float(slope - vector_bytes))


def plan_corpus(
    n_chunks: int,
    *,
    vector_bytes: float,
    chunk_bytes: float,
    base_bytes: float,
    node_memory_bytes: float,
    usable_fraction: float = 0.6,
    replicas: int = 1,
    max_shard_chunks: int | None = None,
    node_cpus: int | None = None,
    scan_ms: float | None = None,
) -> dict[str, Any]:
    """Shards and nodes for ``n_chunks``.

    A shard is as large as fits ``usable_fraction`` of one node's memory (or ``max_shard_chunks``);
    every shard has ``replicas`` actors; replicas of a shard sit on different nodes (nodes >=
    replicas); a node holds as many shard actors as fit its memory and, with ``node_cpus``, no more
    actors than cores (each searches on one thread). With ``scan_ms`` (one-thread search time of a
    full shard), ``qps_max`` is the query rate at which every core of the cluster is busy: a query
    costs one search on every shard."""
    if n_chunks < 0 or node_memory_bytes <= 0 or not 0 < usable_fraction <= 1 or replicas < 1:
        raise ValueError("n_chunks >= 0, node_memory_bytes > 0, 0 < usable_fraction <= 1, replicas >= 1")
    if node_cpus is not None and node_cpus < 1:
        raise ValueError(f"node_cpus must be >= 1, got {node_cpus}")
    per_chunk = vector_bytes + chunk_bytes
    budget = node_memory_bytes * usable_fraction
    fit = int((budget - base_bytes) // per_chunk) if budget > base_bytes else 0
    if fit < 1:
        raise ValueError(f"a node with {node_memory_bytes / 2**30:.1f} GiB cannot hold even one chunk's shard")
    shard_chunks = min(fit, max_shard_chunks) if max_shard_chunks else fit
    shards = max(1, -(-n_chunks // shard_chunks))
    shard_chunks = -(-n_chunks // shards)  # balance
    shard_rss = base_bytes + shard_chunks * per_chunk
    per_node = max(1, int(budget // shard_rss))
    if node_cpus is not None:
        per_node = min(per_node, node_cpus)
    nodes = max(replicas, -(-shards * replicas // per_node))
    out: dict[str, Any] = {
        "n_chunks": n_chunks,
        "shards": shards,
        "chunks_per_shard": shard_chunks,
        "shard_rss_gib": round(shard_rss / 2**30, 2),
        "replicas": replicas,
        "shards_per_node": per_node,
        "nodes": nodes,
        "total_gib": round(shards * replicas * shard_rss / 2**30, 1),
    }
    if scan_ms is not None and node_cpus is not None:
        busy_cores = min(nodes * node_cpus, shards * replicas)  # an actor searches on one core
        out["qps_max"] = round(busy_cores * 1000.0 / (shards * scan_ms), 1) if scan_ms > 0 else None
    return out


def plan_factories(factories: Sequence[str], n_chunks: int, dim: int, chunk_bytes: float, base_bytes: float, *,
                   node_memory_bytes: float, usable_fraction: float, replicas: int, node_cpus: int,
                   target_ms: float, cost: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """:func:`plan_corpus` per factory at ``dim``, with bytes per vector projected from FAISS code
    sizes (checked against the measured sizes in the trade-off table) plus the int32 chunk -> unit
    map. An exhaustive factory's shard is also capped so that a one-thread scan stays within
    ``target_ms`` (from its measured scan cost ``cost[factory]`` in ms per vector x dim, or Flat's)."""
    cost = cost or {}
    rows = []
    for factory in factories:
        bpv = projected_bytes_per_vector(factory, dim) + 4
        per = cost.get(factory, cost.get("Flat")) if exhaustive(factory) else None
        cap = max(1, int(target_ms / (per * dim))) if per else None
        kw = dict(vector_bytes=bpv, chunk_bytes=chunk_bytes, base_bytes=base_bytes,
                  node_memory_bytes=node_memory_bytes, usable_fraction=usable_fraction,
                  replicas=replicas, max_shard_chunks=cap, node_cpus=node_cpus)
        p = plan_corpus(n_chunks, **kw)
        if per:  # again with the scan time of the balanced shard, for the query rate
            p = plan_corpus(n_chunks, **kw, scan_ms=per * dim * p["chunks_per_shard"])
        rows.append({"factory": factory, "bytes_per_vector": round(bpv, 1),
                     "vectors_gib": round(n_chunks * bpv / 2**30, 1), **p,
                     "scan_ms": (round(per * dim * p["chunks_per_shard"], 1) if per
                                 else "not measured" if exhaustive(factory) else "sublinear"),
                     "qps_max": p.get("qps_max", "n/a")})
    return rows


def scan_cost(tradeoff_rows: list[dict[str, Any]]) -> dict[str, float]:
    """Measured ms per (vector x dim) of each exhaustive factory's one-thread search."""
    out: dict[str, float] = {}
    for r in tradeoff_rows:
        if exhaustive(r["factory"]) and r["factory"] not in out:
            out[r["factory"]] = r["search_ms_per_query"] / (r["n"] * r["dim"])
    return out
