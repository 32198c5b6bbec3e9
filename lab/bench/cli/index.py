"""Index capacity benchmark: ANN/compression trade-off against exact MaxP search, a memory model
for shard replicas checked on a simulated multi-node Ray cluster, and a plan for full Wikipedia.

    python -m jobs.bench index                         # 100K vectors x 384 dims, 3-node check, plan
    python -m jobs.bench index --vectors 1000000       # the trade-off at 1M vectors (a few GB of RAM)
    python -m jobs.bench index --skip-cluster --factories Flat,HNSW32

1. Trade-off: seeded clustered vectors (``lab.synthetic.vectors.clustered_vectors``; real embeddings of
   this size cannot be made on a CPU box) indexed with each FAISS factory; per factory and search
   setting: bytes per vector, build time, search latency (one thread, the shard replicas' setting)
   and MaxP unit recall@k against exact Flat search; compressed indexes with exact re-ranking
   (``IVF{nlist},PQ48,RFlat``, swept over ``nprobe`` and ``k_factor_rf``) among them.
2. Memory model: shards of synthetic chunks (vectors plus ``--chunk-chars`` of text per chunk, as
   real shards hold units and chunks) are written to a temporary store and served by shard
   deployments on a simulated cluster of ``--nodes`` nodes; the RSS of the smaller shards fits
   ``RSS = base + chunks x (vector bytes + chunk bytes)`` and the largest shard checks the fit.
   A scatter/gather search over all shards is timed against one in-process index of the same size;
   and (``shard_overhead``) exact MaxP through shard deployments against one in-process Flat index over
   the same vectors, a batch of 64 queries per call (the goal: at most 1.15x).
3. Plan: shards and nodes for ``--plan-chunks`` chunks of ``--plan-dim`` dims (docs/benchmarks.md's plan:
   full Wikipedia ~5M chunks, bge-large 1024 dims) per factory, for a node of ``--node-gib`` GiB; an
   exhaustive factory's shards are also kept small enough for a ``--target-ms`` one-thread scan.

Prints tables, writes ``OUT/ann_tradeoff.png`` and ``OUT/bench_index.json``, ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from lab.bench.tables import markdown_table
from lab.synthetic.vectors import clustered_vectors, synthetic_shard, write_synthetic_build
from lab.tradeoff import interleaved_ms, measure_factory, plot_tradeoff
from longrag.cli import int_list, number
from longrag.index.capacity import CapacityModel, plan_factories, projected_bytes_per_vector, scan_cost
from longrag.index.factories import default_nlist, factory_problem, split_factories, sweep_for
from longrag.index.maxp import MaxPIndex

DEFAULT_FACTORIES = "Flat,SQfp16,SQ8,IVF{nlist},Flat,IVF{nlist},SQ8,IVF{nlist},PQ48,IVF{nlist},PQ48,RFlat,HNSW32"
PLAN_FACTORIES = "Flat,SQfp16,SQ8,IVF{nlist},SQ8,IVF{nlist},PQ128,HNSW32"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)

# ------------------------------------------------------------------------------------- 1. trade-off
def tradeoff(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, float]]:
    log(f"generating {args.vectors:,} clustered vectors x {args.dim} dims ...")
    vectors, chunk_ids, unit_ids, queries = clustered_vectors(
        args.vectors, args.dim, chunks_per_unit=args.chunks_per_unit, n_queries=args.queries, seed=args.seed
    )
    nlist = default_nlist(args.vectors)
    rows: list[dict[str, Any]] = []
    exact = None
    bpv: dict[str, float] = {}
    for factory in split_factories(args.factories, nlist):
        faiss.omp_set_num_threads(args.build_threads)
        log(f"  {factory}: building ...")
        # searches run on one thread, as each shard actor does
        results, exact = measure_factory(vectors, chunk_ids, unit_ids, queries, factory,
                                         search_params=sweep_for(factory), k=args.k, exact_hits=exact,
                                         search_threads=1)
        projected = projected_bytes_per_vector(factory, args.dim)
        for r in results:
            rows.append({**r.to_dict(), "projected_bytes_per_vector": round(projected, 1),
                         "queries_per_s": round(1e3 / r.search_ms_per_query, 1) if r.search_ms_per_query else None})
            log(f"    {r.search_params or '-':>12}: {r.bytes_per_vector:8.1f} B/vec  build {r.build_s:7.2f} s  "
                f"search {r.search_ms_per_query:8.3f} ms/q  unit recall@{r.k} {r.recall_at_k:.3f}")
        bpv[factory] = results[0].bytes_per_vector
    return rows, bpv


# ------------------------------------------------------------------------------------- 2. memory model
def cluster_check(args: argparse.Namespace) -> dict[str, Any]:
    from cluster.local import start_or_join
    from longrag.config import IndexConfig
    from serve.index_app import open_index

    sizes = list(args.shard_sizes)
    if len(sizes) < 3:
        raise ValueError("--shard-sizes needs at least 3 sizes: the smaller ones fit the model, the largest checks it")
    with tempfile.TemporaryDirectory(prefix="bench-index-") as root:
        log(f"writing a {len(sizes)}-shard synthetic build ({sum(sizes):,} chunks, {args.chunk_chars} chars each) ...")
        write_synthetic_build(root, sizes, args.dim, args.chunk_chars, args.chunks_per_unit, args.seed)
        handle = start_or_join(None, num_cpus=2, nodes=args.nodes, object_store_memory=128 * 1024**2)
        try:
            log(f"serving it from shard deployments on a simulated {args.nodes}-node Ray cluster ...")
            config = IndexConfig(shard_num_cpus=0.1, shard_memory_factor=0, search_timeout_s=120)
            with open_index(root, config) as client:
                queries = clustered_vectors(1000, args.dim, n_queries=64, seed=args.seed + 99)[3]
                client.search_sync(queries[:4], args.k)  # warm-up
                time.sleep(1.0)
                infos = sorted(asyncio.run(client.infos()), key=lambda i: i["shard_id"])  # RSS after load + search
                t0 = time.perf_counter()
                for q in queries:
                    client.search_sync(q[None, :], args.k)
                scatter_ms = (time.perf_counter() - t0) * 1000 / len(queries)
        finally:
            handle.shutdown()
    vec_bytes = 4.0 * args.dim + 4  # Flat codes + the int32 chunk -> unit map
    n = [i["n_chunks"] for i in infos]
    rss = [float(i["rss_bytes"]) for i in infos]
    order = np.argsort(n)
    fit_idx, check_idx = order[:-1], order[-1]
    model = CapacityModel.fit([n[i] for i in fit_idx], [rss[i] for i in fit_idx], vec_bytes)
    predicted = model.shard_rss(n[check_idx], vec_bytes)
    # the same total in one in-process index, one thread (what a single big shard would cost per query)
    faiss.omp_set_num_threads(1)
    vectors, chunk_ids, unit_ids, _ = clustered_vectors(sum(sizes), args.dim, chunks_per_unit=args.chunks_per_unit,
                                                        n_queries=0, seed=args.seed)
    single = MaxPIndex.build(vectors, chunk_ids, unit_ids)
    single.search(queries[:4], args.k)
    t0 = time.perf_counter()
    for q in queries:
        single.search(q[None, :], args.k)
    single_ms = (time.perf_counter() - t0) * 1000 / len(queries)
    nodes_used = len({i["node_id"] for i in infos})
    return {
        "nodes": args.nodes,
        "nodes_used": nodes_used,
        "shards": [{"shard": i["shard_id"], "chunks": i["n_chunks"], "rss_mib": round(i["rss_bytes"] / 2**20, 1),
                    "node": i["node_id"][:8]} for i in infos],
        "model": {"base_mib": round(model.base_bytes / 2**20, 1), "chunk_bytes": round(model.chunk_bytes, 1),
                  "vector_bytes": vec_bytes, "fitted_on": [n[i] for i in fit_idx]},
        "check": {"chunks": n[check_idx], "measured_mib": round(rss[check_idx] / 2**20, 1),
                  "predicted_mib": round(predicted / 2**20, 1),
                  "error_pct": round(100 * (predicted - rss[check_idx]) / rss[check_idx], 1)},
        "latency": {"scatter_gather_ms": round(scatter_ms, 2), "single_index_ms": round(single_ms, 2),
                    "shards": len(sizes), "total_chunks": sum(sizes)},
        "chunk_chars": args.chunk_chars,
    }


# ------------------------------------------------------------------------------------- 2b. actor overhead
def shard_overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Exact MaxP through ``--overhead-shards`` shard deployments on one local Ray (the cores split
    between them) vs one in-process MaxP Flat index over the same vectors on all the cores, a batch
    of ``--overhead-batch`` queries per call; medians of interleaved calls."""
    from cluster.local import start_or_join
    from longrag.config import IndexConfig
    from serve.index_app import open_index

    n_shards, batch = args.overhead_shards, args.overhead_batch
    threads = max(1, (os.cpu_count() or 1) // n_shards)
    sizes = [args.vectors // n_shards] * n_shards
    parts = [synthetic_shard(n, args.dim, 200, args.chunks_per_unit, args.seed, s, sum(sizes[:s]))
             for s, n in enumerate(sizes)]
    chunks = [c for _, cs, _ in parts for c in cs]
    single = MaxPIndex.build(np.concatenate([v for v, _, _ in parts]), [c.chunk_id for c in chunks],
                             [c.unit_id for c in chunks])
    queries = clustered_vectors(batch * args.overhead_repeats, args.dim, n_queries=batch * args.overhead_repeats,
                                seed=args.seed + 7)[3].reshape(args.overhead_repeats, batch, args.dim)
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as root:
        write_synthetic_build(root, sizes, args.dim, 200, args.chunks_per_unit, args.seed)
        handle = start_or_join(None, num_cpus=threads * n_shards + 1, object_store_memory=256 * 2**20)
        try:
            config = IndexConfig(shard_num_cpus=threads, shard_threads=threads, shard_memory_factor=0,
                                 search_timeout_s=120)
            with open_index(root, config) as client:
                faiss.omp_set_num_threads(threads * n_shards)
                got, want = client.search_sync(queries[0], args.k).hits, single.search(queries[0], args.k)
                if [[h.unit_id for h in row] for row in got] != [[h.unit_id for h in row] for row in want]:
                    raise AssertionError("the sharded search disagrees with the single index")
                a, b = interleaved_ms(lambda q: client.search_sync(q, args.k), lambda q: single.search(q, args.k),
                                      queries)
        finally:
            handle.shutdown()
    return {"vectors": sum(sizes), "shards": n_shards, "threads_per_shard": threads, "batch": batch,
            "repeats": args.overhead_repeats, "shards_ms": round(a, 2), "single_ms": round(b, 2),
            "ratio": round(a / b, 3), "queries_per_s_shards": round(1e3 * batch / a, 1),
            "queries_per_s_single": round(1e3 * batch / b, 1)}


# ------------------------------------------------------------------------------------- CLI
def _check_factories(p: argparse.ArgumentParser, flag: str, spec: str, dim: int, n: int) -> None:
    """Refuse a factory string FAISS cannot build, before any work starts."""
    for factory in split_factories(spec, default_nlist(n)):
        if problem := factory_problem(factory, dim):
            p.error(f"argument {flag}: {factory!r} is not a FAISS index factory string for {dim} dimensions "
                    f"({problem}); e.g. Flat, SQ8, IVF{{nlist}},SQ8, HNSW32, IVF{{nlist}},PQ48,RFlat")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.bench index", description=__doc__.split("\n\n")[0])
    pos_int, nonneg_int = number(int, min_value=1), number(int, min_value=0)
    pos_float = number(float, min_value=0, min_exclusive=True)
    p.add_argument("--vectors", type=pos_int, default=100_000)
    p.add_argument("--dim", type=pos_int, default=384, help="384 = MiniLM (bundled); bge-large is 1024")
    p.add_argument("--chunks-per-unit", type=pos_int, default=8)
    p.add_argument("--queries", type=pos_int, default=200)
    p.add_argument("--k", type=pos_int, default=10)
    p.add_argument("--factories", default=DEFAULT_FACTORIES, help="FAISS factory strings; {nlist} = 4 sqrt(n)")
    p.add_argument("--build-threads", type=pos_int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--skip-tradeoff", action="store_true")
    p.add_argument("--skip-cluster", action="store_true")
    p.add_argument("--nodes", type=pos_int, default=3)
    p.add_argument("--shard-sizes", type=int_list(min_value=1, min_len=3), default=[10000, 20000, 30000, 50000],
                   help="chunks per shard in the cluster check (3 or more); the largest checks the fit of the others")
    p.add_argument("--chunk-chars", type=pos_int, default=1000, help="text per synthetic chunk (~250 tokens)")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--overhead-shards", type=pos_int, default=2, help="shard deployments of the overhead check")
    p.add_argument("--overhead-batch", type=pos_int, default=64, help="queries per call in the overhead check")
    p.add_argument("--overhead-repeats", type=pos_int, default=20)
    p.add_argument("--plan-factories", default=PLAN_FACTORIES)
    p.add_argument("--plan-chunks", type=pos_int, default=5_000_000)
    p.add_argument("--plan-dim", type=pos_int, default=1024)
    p.add_argument("--plan-chunk-chars", type=pos_int, default=2300, help="~512 tokens of English")
    p.add_argument("--node-gib", type=pos_float, default=64.0)
    p.add_argument("--node-cpus", type=pos_int, default=16, help="cores per node: shard replicas per node at most")
    p.add_argument("--target-ms", type=pos_float, default=100.0,
                   help="one-thread scan budget per query and shard for exhaustive factories")
    p.add_argument("--usable-fraction", type=number(float, min_value=0, max_value=1, min_exclusive=True), default=0.6)
    p.add_argument("--replicas", type=pos_int, default=2)
    p.add_argument("--out", default="reports/bench-index")
    args = p.parse_args(argv)
    _check_factories(p, "--factories", args.factories, args.dim, args.vectors)
    _check_factories(p, "--plan-factories", args.plan_factories, args.plan_dim, args.plan_chunks)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"args": vars(args), "cpus": os.cpu_count()}
    t_all = time.perf_counter()
    if not args.skip_tradeoff:
        rows, _ = tradeoff(args)
        result["tradeoff"] = rows
        plot_tradeoff(rows, out / "ann_tradeoff.png")
        print(f"\n## ANN / compression vs exact MaxP ({args.vectors:,} clustered vectors x {args.dim}, "
              f"k={args.k}, one search thread)\n")
        print(markdown_table(rows, ["factory", "search_params", "bytes_per_vector", "projected_bytes_per_vector", "build_s",
                            "search_ms_per_query", "queries_per_s", "recall_at_k"]))
        print(f"\nplot: {out / 'ann_tradeoff.png'}")
    chunk_bytes, base_bytes = 2.0 * args.chunk_chars + 300.0, 250 * 2**20  # used only without the cluster check
    if not args.skip_cluster:
        check = cluster_check(args)
        result["cluster"] = check
        chunk_bytes, base_bytes = check["model"]["chunk_bytes"], check["model"]["base_mib"] * 2**20
        print(f"\n## Shard memory on a simulated {check['nodes']}-node Ray cluster "
              f"(Flat, {args.dim} dims, {args.chunk_chars} chars per chunk)\n")
        print(markdown_table(check["shards"], ["shard", "chunks", "rss_mib", "node"]))
        m, c = check["model"], check["check"]
        print(f"\nfit on {m['fitted_on']}: RSS = {m['base_mib']} MiB + chunks x ({m['vector_bytes']:.0f} B vector + "
              f"{m['chunk_bytes']:.0f} B text/ids)")
        print(f"check on the {c['chunks']:,}-chunk shard: predicted {c['predicted_mib']} MiB, measured "
              f"{c['measured_mib']} MiB ({c['error_pct']:+.1f}%)")
        lat = check["latency"]
        print(f"search, 1 query: scatter/gather over {lat['shards']} shard deployments {lat['scatter_gather_ms']} ms vs "
              f"one in-process index of {lat['total_chunks']:,} chunks {lat['single_index_ms']} ms")
    if not args.skip_overhead:
        o = result["overhead"] = shard_overhead(args)
        print(f"\n## Sharded exact MaxP through {o['shards']} shard deployments vs one in-process Flat index "
              f"({o['vectors']:,} x {args.dim}, batch of {o['batch']}, median of {o['repeats']}): "
              f"{o['shards_ms']} ms vs {o['single_ms']} ms = {o['ratio']}x (goal <= 1.15x)")
    # 3. plan: plan_factories with this run's settings and fitted constants
    plan_rows = result["plan"] = plan_factories(
        split_factories(args.plan_factories, default_nlist(args.plan_chunks)), args.plan_chunks, args.plan_dim,
        chunk_bytes * args.plan_chunk_chars / args.chunk_chars, base_bytes, node_memory_bytes=args.node_gib * 2**30,
        usable_fraction=args.usable_fraction, replicas=args.replicas, node_cpus=args.node_cpus,
        target_ms=args.target_ms, cost=scan_cost(result.get("tradeoff", [])))
    print(f"\n## Plan: {args.plan_chunks:,} chunks x {args.plan_dim} dims, {args.plan_chunk_chars} chars each, "
          f"{args.replicas} replicas, {args.node_gib:g} GiB / {args.node_cpus}-core nodes "
          f"({args.usable_fraction:.0%} of memory for shards, scans within {args.target_ms:g} ms)\n")
    print(markdown_table(plan_rows, ["factory", "bytes_per_vector", "vectors_gib", "shards", "chunks_per_shard",
                             "shard_rss_gib", "scan_ms", "shards_per_node", "nodes", "total_gib", "qps_max"]))
    result["wall_s"] = round(time.perf_counter() - t_all, 1)
    (out / "bench_index.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, default=str))
    return 0
