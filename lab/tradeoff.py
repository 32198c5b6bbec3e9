"""The approximate-search trade-off of FAISS factories against exact MaxP search: each factory's
serialized bytes per vector, build time, search latency and MaxP unit recall@k against Flat
(:func:`measure_factory`), the alternating timing of two searches, and the trade-off plot.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import faiss
import numpy as np

from longrag.index.maxp import MaxPIndex


def index_bytes_per_vector(index: MaxPIndex) -> float:
    """Serialized FAISS index size per vector (codes, graph links, inverted lists, centroids)."""
    if index.ntotal == 0:
        return 0.0
    return len(faiss.serialize_index(index.index)) / index.ntotal


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
