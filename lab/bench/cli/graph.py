"""The unit link graph at corpus scale (``retrieval.mode=graph``): memory per million units, file
size, load time, and the added latency of the graph expansion per question, on a synthetic graph.

    python -m jobs.bench graph                                  # 1M units, 10 links each on average
    python -m jobs.bench graph --units 200000 --degree 20 --queries 500

The graph: ``--units`` units on ``--shards`` shards, ``units x degree / 2`` links whose ends are
drawn from a Zipf-like law (a few hubs with thousands of links, most units with a handful, as
Wikipedia's link graph), contracted and stored exactly as a build does
(:func:`longrag.index.graph.unit_graph_from_labels`, ``unit_graph.parquet``). Each query is a
first stage of ``retrieval.graph_depth`` random units with decreasing scores, expanded with the
default ``retrieval.graph_*`` settings (:func:`longrag.index.graph.expand`, what the Retriever
runs). Prints a table and one JSON line; writes both to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict

import numpy as np

from lab.bench import latency_stats, machine
from lab.bench.tables import markdown_table, publish
from longrag.cli import job_setup, number
from longrag.config import RetrievalConfig
from longrag.index.graph import GraphExpansion, UnitGraph, expand, unit_graph_from_labels
from longrag.memory import MemorySampler
from longrag.types import UnitHit


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def synthetic_links(n: int, degree: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n * degree / 2`` links, each end drawn with probability ~ 1 / (rank + 10) over a random order."""
    rng = np.random.default_rng(seed)
    m = int(n * degree / 2)
    weights = 1.0 / (np.arange(n) + 10.0)
    cdf = np.cumsum(weights / weights.sum())
    perm = rng.permutation(n)
    ends = perm[np.minimum(np.searchsorted(cdf, rng.random(2 * m)), n - 1)]
    return ends[:m], ends[m:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobs.bench graph", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--units", type=number(int, min_value=10), default=1_000_000)
    p.add_argument("--degree", type=number(float, min_value=0.0), default=10.0, help="links per unit, on average")
    p.add_argument("--shards", type=number(int, min_value=1), default=8)
    p.add_argument("--queries", type=number(int, min_value=1), default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="reports/bench-graph")
    args = p.parse_args(argv)
    job_setup()
    at_start = machine()
    n = args.units
    ids = [f"g{i:09d}" for i in range(n)]
    t0 = time.perf_counter()
    src, dst = synthetic_links(n, args.degree, args.seed)
    with MemorySampler(interval_s=0.05) as sampler:  # RSS: tracemalloc races native threads (a segfault)
        graph = unit_graph_from_labels(ids, np.arange(n) % args.shards, np.arange(n), src, dst)
    build_peak = sampler.extra_mb * 2**20
    build_s = time.perf_counter() - t0
    del src, dst
    data = graph.to_parquet()
    t1 = time.perf_counter()
    loaded = UnitGraph.from_parquet(data)
    _ = loaded.position, loaded.matrix  # what the first graph request builds: the id lookup, the CSR
    load_s = time.perf_counter() - t1
    held = loaded.nbytes()
    settings = GraphExpansion.of(RetrievalConfig())
    rng = np.random.default_rng(args.seed + 1)
    times, added = [], []
    for _ in range(args.queries):
        picked = rng.choice(n, settings.depth, replace=False)
        hits = [UnitHit(unit_id=ids[int(u)], score=1.0 - 0.01 * r, best_chunk_id="c", shard=int(u) % args.shards)
                for r, u in enumerate(picked)]
        t = time.perf_counter()
        out = expand(hits, loaded, 8, settings)
        times.append((time.perf_counter() - t) * 1e3)
        added.append(sum(h.found_by == "graph" for h in out))
    degrees = np.diff(loaded.indptr)
    lat = latency_stats(times)
    per_million = 1e6 / n
    summary = {
        "bench": "graph", "units": n, "links": loaded.n_links, "mean_degree": round(float(degrees.mean()), 2),
        "max_degree": int(degrees.max()), "file_mb": round(len(data) / 2**20, 1),
        "memory_mb": round(held / 2**20, 1), "memory_mb_per_million_units": round(held / 2**20 * per_million, 1),
        "build_peak_mb": round(build_peak / 2**20, 1), "build_s": round(build_s, 2), "load_s": round(load_s, 2),
        "expand_ms": asdict(lat), "graph_units_in_top8": round(float(np.mean(added)), 2),
        "settings": settings.__dict__, "machine": {"start": at_start, "end": machine()},
    }
    memory = f"{summary['memory_mb']} MB ({summary['memory_mb_per_million_units']} MB per million units)"
    rows = [("units / links", f"{n:,} / {loaded.n_links:,} (mean degree {summary['mean_degree']}, "
                              f"max {summary['max_degree']:,})"),
            ("unit_graph.parquet", f"{summary['file_mb']} MB"), ("held by the Retriever (counted)", memory),
            ("load (parquet, id lookup, CSR)", f"{summary['load_s']} s"),
            ("build (contraction)", f"{summary['build_s']} s, resident peak +{summary['build_peak_mb']} MB"),
            ("expand per question", f"p50 {summary['expand_ms']['p50_ms']} ms, p99 {summary['expand_ms']['p99_ms']} ms"),
            ("load average", f"{at_start['loadavg']} -> {summary['machine']['end']['loadavg']}")]
    publish(args.out, markdown_table([{"measure": a, "value": b} for a, b in rows], ["measure", "value"]), summary)
    return 0
