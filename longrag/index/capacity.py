"""Capacity planning for the sharded MaxP index: what a shard costs in memory, and what an
approximate FAISS factory trades in recall for that memory.

* :func:`clustered_vectors` makes unit-normalised vectors around random topic centres, with
  chunks of a unit near each other (a unit is about one subject), and queries near random chunks:
  a stand-in for real embeddings at sizes a CPU machine cannot embed, seeded and reproducible.
* :func:`measure_factory` builds one factory over the vectors and reports bytes per vector,
  build time, search latency and MaxP unit recall@k against exact (Flat) search.
* :class:`CapacityModel` predicts a shard actor's resident memory from its chunk count, the
  factory's bytes per vector and the bytes each chunk's text and ids take once loaded, plus a
  fixed process baseline; ``jobs.bench_index`` fits those constants on one machine and checks the
  prediction against shard actors on a simulated multi-node Ray cluster.
* :func:`plan_corpus` turns a corpus size into shards and nodes for a memory budget.

No Ray here; FAISS and numpy only.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import faiss
import numpy as np

from longrag.index.maxp import MaxPIndex

__all__ = [
    "CapacityModel",
    "FactoryResult",
    "clustered_vectors",
    "index_bytes_per_vector",
    "interleaved_ms",
    "projected_bytes_per_vector",
    "measure_factory",
    "factory_problem",
    "plan_corpus",
    "plan_factories",
    "plot_tradeoff",
    "refined",
    "scan_cost",
    "split_factories",
    "sweep_for",
    "unit_recall",
    "synthetic_shard",
    "write_synthetic_build",
]

SEARCH_SWEEP = {"IVF": ["nprobe=1", "nprobe=8", "nprobe=32"], "HNSW": ["efSearch=16", "efSearch=64", "efSearch=256"]}
"""Search-time settings measured per approximate factory family (recall vs latency)."""
REFINE_SWEEP = ["nprobe=8,k_factor_rf=1", "nprobe=8,k_factor_rf=4", "nprobe=32,k_factor_rf=4",
                "nprobe=32,k_factor_rf=16"]
"""Settings of a factory with exact re-ranking (``RFlat`` / ``Refine(...)``): probes, and how many
candidates per wanted result the compressed index hands to the re-ranking stage."""


def clustered_vectors(
    n_chunks: int,
    dim: int,
    *,
    chunks_per_unit: int = 8,
    n_topics: int = 1000,
    unit_spread: float = 0.6,
    chunk_spread: float = 0.35,
    n_queries: int = 200,
    query_spread: float = 0.35,
    seed: int = 0,
) -> tuple[np.ndarray, list[str], list[str], np.ndarray]:
    """``(vectors float32 (n, dim), chunk_ids, unit_ids, queries float32 (q, dim))``, all rows unit norm.

    Each unit sits near a topic centre (``unit_spread``), each chunk near its unit
    (``chunk_spread``), each query near a random chunk (``query_spread``); spreads are the norm of
    the Gaussian noise relative to the unit-norm point it perturbs."""
    if n_chunks < 1 or dim < 2 or chunks_per_unit < 1 or n_topics < 1 or n_queries < 0:
        raise ValueError("n_chunks, dim (>= 2), chunks_per_unit, n_topics must be positive; n_queries >= 0")
    rng = np.random.default_rng(seed)

    def normed(x: np.ndarray) -> np.ndarray:
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def noise(rows: int, spread: float) -> np.ndarray:
        return rng.standard_normal((rows, dim)).astype(np.float32) * (spread / math.sqrt(dim))

    n_units = -(-n_chunks // chunks_per_unit)
    topics = normed(rng.standard_normal((n_topics, dim)).astype(np.float32))
    units = normed(topics[rng.integers(0, n_topics, n_units)] + noise(n_units, unit_spread))
    unit_of_chunk = np.repeat(np.arange(n_units), chunks_per_unit)[:n_chunks]
    vectors = np.empty((n_chunks, dim), dtype=np.float32)
    step = 65536  # bounded temporaries at millions of rows
    for lo in range(0, n_chunks, step):
        hi = min(n_chunks, lo + step)
        vectors[lo:hi] = normed(units[unit_of_chunk[lo:hi]] + noise(hi - lo, chunk_spread))
    queries = np.zeros((0, dim), dtype=np.float32)
    if n_queries:
        queries = normed(vectors[rng.integers(0, n_chunks, n_queries)] + noise(n_queries, query_spread))
    width = len(str(n_units))
    unit_ids = [f"u{u:0{width}d}" for u in unit_of_chunk.tolist()]
    chunk_ids = [f"c{i}" for i in range(n_chunks)]
    return vectors, chunk_ids, unit_ids, queries


def index_bytes_per_vector(index: MaxPIndex) -> float:
    """Serialized FAISS index size per vector (codes, graph links, inverted lists, centroids)."""
    if index.ntotal == 0:
        return 0.0
    return len(faiss.serialize_index(index.index)) / index.ntotal


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


def unit_recall(approx: Sequence[Sequence[Any]], exact: Sequence[Sequence[Any]], k: int) -> float:
    """Mean over queries of |approx top-k units ∩ exact top-k units| / min(k, |exact|)."""
    if len(approx) != len(exact):
        raise ValueError(f"{len(approx)} approximate result lists for {len(exact)} exact ones")
    if not exact:
        return float("nan")
    total = 0.0
    for a, e in zip(approx, exact):
        want = {h.unit_id for h in e[:k]}
        got = {h.unit_id for h in a[:k]}
        total += len(want & got) / max(1, min(k, len(want)))
    return total / len(exact)


@dataclass(frozen=True)
class FactoryResult:
    factory: str
    search_params: str
    n: int
    dim: int
    bytes_per_vector: float
    build_s: float
    search_ms_per_query: float
    recall_at_k: float
    k: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_factory(
    vectors: np.ndarray,
    chunk_ids: Sequence[str],
    unit_ids: Sequence[str],
    queries: np.ndarray,
    factory: str,
    *,
    search_params: Sequence[str] = ("",),
    k: int = 10,
    exact_hits: list[list[Any]] | None = None,
    metric: str = "ip",
    search_threads: int | None = None,
) -> tuple[list[FactoryResult], list[list[Any]]]:
    """Build ``factory`` once (with FAISS's current thread count), then search with each of
    ``search_params`` on ``search_threads`` threads (unchanged when None); recall is against
    ``exact_hits`` (computed with Flat when not given). Returns the rows and the exact hits."""
    if exact_hits is None:
        flat = MaxPIndex.build(vectors, chunk_ids, unit_ids, factory="Flat", metric=metric)  # type: ignore[arg-type]
        exact_hits = flat.search(queries, k)
        del flat
    t0 = time.perf_counter()
    index = MaxPIndex.build(vectors, chunk_ids, unit_ids, factory=factory, metric=metric)  # type: ignore[arg-type]
    build_s = time.perf_counter() - t0
    bpv = index_bytes_per_vector(index)
    if search_threads is not None:
        faiss.omp_set_num_threads(search_threads)
    rows = []
    for params in search_params:
        index.set_search_params(params)
        index.search(queries[: min(8, len(queries))], k)  # warm-up
        t0 = time.perf_counter()
        hits = index.search(queries, k)
        per_q = (time.perf_counter() - t0) * 1000.0 / max(1, len(queries))
        rows.append(FactoryResult(factory, params, index.ntotal, index.dim, round(bpv, 2), round(build_s, 3),
                                  round(per_q, 3), round(unit_recall(hits, exact_hits, k), 4), k))
    return rows, exact_hits


@dataclass(frozen=True)
class CapacityModel:
    """RSS of a shard actor ≈ ``base_bytes + n_chunks · (vector_bytes + chunk_bytes)``.

    ``vector_bytes`` is the factory's bytes per vector (:func:`index_bytes_per_vector`, ~4·dim for
    Flat); ``chunk_bytes`` is what one chunk's text, ids and unit share cost in memory once loaded
    (measured: it scales with the chunk's text length); ``base_bytes`` is the process baseline
    (Python, FAISS, pyarrow, Ray worker)."""

    base_bytes: float
    chunk_bytes: float

    def shard_rss(self, n_chunks: int, vector_bytes: float) -> float:
        return self.base_bytes + n_chunks * (vector_bytes + self.chunk_bytes)

    @classmethod
    def fit(cls, n_chunks: Sequence[int], rss: Sequence[float], vector_bytes: float) -> "CapacityModel":
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


def interleaved_ms(a: Any, b: Any, inputs: Sequence[Any]) -> tuple[float, float]:
    """Median milliseconds of ``a(x)`` and ``b(x)`` over ``inputs``, called alternately so that both
    see the same machine load (a shared machine's load drifts within a run)."""
    ta, tb = [], []
    for x in inputs:
        t0 = time.perf_counter()
        a(x)
        t1 = time.perf_counter()
        b(x)
        ta.append((t1 - t0) * 1e3)
        tb.append((time.perf_counter() - t1) * 1e3)
    return float(np.median(ta)), float(np.median(tb))


# ------------------------------------------------------------------------------------- benchmark helpers
def default_nlist(n_vectors: int) -> int:
    """IVF lists for ``n_vectors``: 4 sqrt(n), at least 16 (FAISS's guideline is 4-16 sqrt(n))."""
    return max(16, int(4 * np.sqrt(n_vectors)))


def split_factories(spec: str, nlist: int) -> list[str]:
    """``"Flat,IVF{nlist},Flat,HNSW32"`` -> ``["Flat", "IVF1024,Flat", "HNSW32"]`` (IVF takes the
    next comma-separated part as its encoding)."""
    parts = [p.strip() for p in spec.format(nlist=nlist).split(",") if p.strip()]
    out: list[str] = []
    i = 0
    while i < len(parts):
        if parts[i].startswith("IVF") and i + 1 < len(parts):
            out.append(f"{parts[i]},{parts[i + 1]}")
            i += 2
        else:
            out.append(parts[i])
            i += 1
        if i < len(parts) and parts[i].startswith(("RFlat", "Refine(")):  # a re-ranking stage belongs to it
            out[-1] += f",{parts[i]}"
            i += 1
    return out


def refined(factory: str) -> bool:
    """Whether ``factory`` re-ranks its candidates with stored vectors (``RFlat``, ``Refine(...)``)."""
    return factory.rsplit(",", 1)[-1].startswith(("RFlat", "Refine("))


def sweep_for(factory: str) -> list[str]:
    if refined(factory):
        return REFINE_SWEEP if factory.startswith("IVF") else ["k_factor_rf=1", "k_factor_rf=4", "k_factor_rf=16"]
    for prefix, params in SEARCH_SWEEP.items():
        if factory.startswith(prefix):
            return params
    return [""]


def exhaustive(factory: str) -> bool:
    """Flat / SQ / PQ scan every vector (latency grows with the shard); IVF and HNSW do not."""
    return not factory.startswith(("IVF", "HNSW"))


def scan_cost(tradeoff_rows: list[dict[str, Any]]) -> dict[str, float]:
    """Measured ms per (vector x dim) of each exhaustive factory's one-thread search."""
    out: dict[str, float] = {}
    for r in tradeoff_rows:
        if exhaustive(r["factory"]) and r["factory"] not in out:
            out[r["factory"]] = r["search_ms_per_query"] / (r["n"] * r["dim"])
    return out


def factory_problem(factory: str, dim: int) -> str | None:
    """Why FAISS cannot build ``factory`` at ``dim`` dimensions (its C++ message), or None."""
    try:
        faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except Exception as exc:  # faiss raises RuntimeError with its C++ message
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        return re.sub(r"^Error in .*? at \S+:\d+: ", "", first)  # drop the C++ location
    return None


def plot_tradeoff(rows: list[dict[str, Any]], path: Any) -> None:
    """Memory vs recall and latency vs recall of the trade-off rows (a PNG at ``path``)."""
    from longrag.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for fac in dict.fromkeys(r["factory"] for r in rows):
        rs = [r for r in rows if r["factory"] == fac]
        axes[0].plot([r["bytes_per_vector"] for r in rs], [r["recall_at_k"] for r in rs], "o", label=fac)
        axes[1].plot([r["search_ms_per_query"] for r in rs], [r["recall_at_k"] for r in rs], "o-", label=fac)
        for r in rs:
            if r["search_params"]:
                label = "/".join(p.split("=")[1] for p in r["search_params"].split(","))
                axes[1].annotate(label, (r["search_ms_per_query"], r["recall_at_k"]),
                                 fontsize=7, xytext=(3, 3), textcoords="offset points")
    k, n, d = rows[0]["k"], rows[0]["n"], rows[0]["dim"]
    axes[0].set(xscale="log", xlabel="index bytes per vector (log)", ylabel=f"MaxP unit recall@{k} vs exact",
                title=f"memory vs recall ({n:,} x {d})")
    axes[1].set(xscale="log", xlabel="search ms per query, 1 thread (log)", ylabel=f"unit recall@{k}",
                title="latency vs recall (labels: nprobe / efSearch / k_factor_rf)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="lower right")
    save_figure(fig, path, dpi=110)


def synthetic_shard(n: int, dim: int, chunk_chars: int, chunks_per_unit: int, seed: int, shard_id: int,
                    offset: int) -> tuple[np.ndarray, list[Any], list[Any]]:
    """One synthetic shard of :func:`write_synthetic_build`: ``(vectors, chunks, units)``."""
    from longrag.text.tokens import chars_estimate
    from longrag.types import Chunk, Unit

    vectors, _, local_units, _ = clustered_vectors(n, dim, chunks_per_unit=chunks_per_unit, n_queries=0,
                                                   seed=seed + shard_id)
    rng = np.random.default_rng(seed + 10_000 + shard_id)
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"])
    n_words = max(1, chunk_chars // 7)
    chunks: list[Chunk] = []
    for i in range(n):
        text = " ".join(words[rng.integers(0, len(words), n_words)].tolist())[:chunk_chars]
        chunks.append(Chunk(chunk_id=f"c{offset + i}", unit_id=f"s{shard_id}-{local_units[i]}",
                            position=i % chunks_per_unit, text=text, n_tokens=chars_estimate(text)))
    by_unit: dict[str, list[Chunk]] = {}
    for c in chunks:
        by_unit.setdefault(c.unit_id, []).append(c)
    units = [Unit(unit_id=u, doc_ids=[u], titles=[u], text=" ".join(c.text for c in cs),
                  n_tokens=sum(c.n_tokens for c in cs)) for u, cs in by_unit.items()]
    return vectors, chunks, units


def write_synthetic_build(root: str, sizes: list[int], dim: int, chunk_chars: int, chunks_per_unit: int,
                          seed: int) -> None:
    """A complete build of ``len(sizes)`` Flat shards of synthetic chunks (text of ``chunk_chars``)."""
    from longrag.config import LongRAGConfig
    from longrag.index.manifest import Manifest
    from longrag.index.artifacts import ArtifactStore, write_shard

    store = ArtifactStore.open(root)
    manifest = Manifest.create(LongRAGConfig(), dim=dim, documents=0, argv=["jobs.bench_index"])
    offset = 0
    for shard_id, n in enumerate(sizes):
        vectors, chunks, units = synthetic_shard(n, dim, chunk_chars, chunks_per_unit, seed, shard_id, offset)
        index = MaxPIndex.build(vectors, [c.chunk_id for c in chunks], [c.unit_id for c in chunks])
        manifest.add_shard(write_shard(store, shard_id, units, chunks, index))
        offset += n
    manifest.mark_complete()
    store.write_manifest(manifest)
