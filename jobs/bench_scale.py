"""Scale benchmark of the index plan (issue: cluster-scale indexing), ending with one JSON line.

    python -m jobs.bench_scale                          # grouping at 100K and 1M documents, 6M projected
    python -m jobs.bench_scale --grouping-sizes 100000,1000000,3000000 --mean-links 10

Grouping: LongRAG Algorithm 1 (Jiang et al., 2024, Section 3.1) on arrays, the way the driver of a
Wikipedia build runs it: seeded Wikipedia-like metadata (``longrag.synthetic.wikigraph``: lognormal
lengths, power-law in-degrees, ``--mean-links`` links per article) -> CSR graph -> group labels. Per
size: wall seconds and CPU seconds of the process (CPU seconds are one core's work: the kernel is
single-threaded, and they hold on a busy machine where wall time does not), the driver's extra
memory, groups and documents per unit. The 6M projection extrapolates the CPU time along the
log-log slope between the two largest sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from typing import Any

import numpy as np

from longrag.cli import int_list, number
from longrag.index.grouping import csr_from_edges, group_csr
from longrag.synthetic.wikigraph import wikilike_graph

WIKIPEDIA_ARTICLES = 6_000_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_mb() -> float:
    """Current resident memory of this process (Linux /proc), MB."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def grouping_run(n_docs: int, mean_links: float, budget: int, seed: int) -> dict[str, Any]:
    graph = wikilike_graph(n_docs, mean_links=mean_links, seed=seed)
    base = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    indptr, indices = csr_from_edges(n_docs, graph.src, graph.dst, symmetric=True)
    t1, c1 = time.perf_counter(), time.process_time()
    labels = group_csr(graph.n_tokens, indptr, indices, budget)
    t2, c2 = time.perf_counter(), time.process_time()
    n_groups = int(labels.max()) + 1
    totals = np.bincount(labels, weights=graph.n_tokens, minlength=n_groups)
    members = np.bincount(labels, minlength=n_groups)
    over = int(((totals > budget) & (members > 1)).sum())
    if over:
        raise AssertionError(f"{over} multi-document groups exceed the budget of {budget} tokens")
    return {
        "docs": n_docs,
        "links": graph.n_links,
        "relations": int(indices.shape[0]) // 2,
        "csr_s": round(t1 - t0, 2),
        "group_s": round(t2 - t1, 2),
        "wall_s": round(t2 - t0, 2),
        "cpu_s": round(c2 - c0, 3),
        "driver_extra_mb": round(rss_mb() - base, 1),
        "input_mb": round(graph.nbytes / 2**20, 1),
        "groups": n_groups,
        "docs_per_unit": round(n_docs / n_groups, 2),
        "multi_doc_units": int((members > 1).sum()),
    }


def project(rows: list[dict[str, Any]], target: int) -> dict[str, Any]:
    """CPU seconds at ``target`` documents along the log-log slope of the two largest runs."""
    a, b = rows[-2], rows[-1]
    slope = math.log(max(b["cpu_s"], 1e-3) / max(a["cpu_s"], 1e-3)) / math.log(b["docs"] / a["docs"])
    return {"docs": target, "slope": round(slope, 3), "cpu_s": round(b["cpu_s"] * (target / b["docs"]) ** slope, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.bench_scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--grouping-sizes", type=int_list(min_value=1000, min_len=2), default=[100_000, 1_000_000],
                   help="documents per grouping run, comma-separated, increasing (default 100000,1000000)")
    p.add_argument("--mean-links", type=number(float, min_value=0.0), default=10.0,
                   help="outgoing links per generated article (default 10: 1M documents -> 10M links)")
    p.add_argument("--budget", type=number(int, min_value=1), default=4096, help="group token budget")
    p.add_argument("--seed", type=number(int, min_value=0), default=0)
    p.add_argument("--target-s", type=number(float, min_value=0.0), default=30.0,
                   help="the goal for 1M documents / 10M links on one core, CPU seconds (default 30)")
    args = p.parse_args(argv)
    if args.grouping_sizes != sorted(args.grouping_sizes) or len(set(args.grouping_sizes)) < 2:
        p.error("--grouping-sizes: give at least two distinct sizes in increasing order")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for n in args.grouping_sizes:
        log(f"grouping {n:,} documents ...")
        rows.append(grouping_run(n, args.mean_links, args.budget, args.seed))
    cols = ["docs", "links", "csr_s", "group_s", "wall_s", "cpu_s", "driver_extra_mb", "groups", "docs_per_unit"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in cols))
    proj = project(rows, WIKIPEDIA_ARTICLES)
    print(f"projected for {proj['docs']:,} articles: {proj['cpu_s']} CPU s (log-log slope {proj['slope']})")
    at_1m = next((r for r in rows if r["docs"] == 1_000_000), None)
    summary = {
        "bench": "scale",
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "grouping": rows,
        "grouping_6m_projection": proj,
        "grouping_1m_cpu_s_over_target": round(at_1m["cpu_s"] / args.target_s, 3) if at_1m else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
