"""Scale benchmark of the index plan (issue: cluster-scale indexing), ending with one JSON line.

    python -m jobs.bench scale                          # grouping at 100K and 1M documents, 6M projected
    python -m jobs.bench scale --grouping-sizes 100000,1000000,3000000 --mean-links 10

Grouping: LongRAG Algorithm 1 (Jiang et al., 2024, Section 3.1) on arrays, the way the driver of a
Wikipedia build runs it: seeded Wikipedia-like metadata (``lab.synthetic.wikigraph``: lognormal
lengths, power-law in-degrees, ``--mean-links`` links per article) -> CSR graph -> group labels. Per
size: wall seconds and CPU seconds of the process (CPU seconds are one core's work: the kernel is
single-threaded, and they hold on a busy machine where wall time does not), the driver's extra
memory, groups and documents per unit. The 6M projection extrapolates the CPU time along the
log-log slope between the two largest sizes.

Driver memory (``--driver-memory-sizes 10000,100000``): per size, a generated Wikipedia-like JSONL
corpus (``write_wikilike_corpus``) is planned by the distributed index build in a fresh driver
process (``actors.distbuild.plan_corpus``: read + parse + token counts in Ray Data, links, grouping,
unit assembly and staging; the chunk + embed stage is left out, ``--skip-embed`` of the issue), whose
peak RSS above its start (Ray and imports loaded) is reported per 1K documents beside the corpus'
text bytes per 1K documents: the driver holds metadata, never text. ``--text-scale-control 4`` reruns
the smallest size with texts 4x longer and the same metadata: the driver's memory must stay.

Embedding (``--embed-chunks 1200``): the same chunk texts (real Wikipedia sentences, ~250 tokens)
encoded by raw ``SentenceTransformer.encode`` in this process with torch using every CPU, then by
the Ray Data embedding pool sized from those CPUs (``actors.embedding.pool_options``); the ratio is
Ray Data chunks/s over raw chunks/s (steady state: after each actor's first batch; end to end:
actor start and model load included).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any

import numpy as np

from lab.bench.scale import embed_texts, grouping_run, project
from lab.bench.tables import markdown_table
from longrag.cli import int_list, number
from longrag.memory import MemorySampler

WIKIPEDIA_ARTICLES = 6_000_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------- driver memory
def driver_memory_run(corpus: str, n_docs: int, cpus: int) -> dict[str, Any]:
    """In this (fresh) process: start Ray, plan the corpus with the distributed build and report the
    driver's memory. Run through ``--_driver-run`` so each size gets its own process."""
    import tempfile

    from actors.distbuild import plan_corpus
    from cluster.local import start_or_join
    from longrag.config import load_config

    handle = start_or_join(None, num_cpus=cpus)
    config = load_config(None, ["units.kind=grouped", "index.shards=4"])
    t0 = time.perf_counter()
    try:
        with MemorySampler(0.05) as mem, tempfile.TemporaryDirectory(prefix="bench-scale-build-") as out:
            plan, report, corpus_art = plan_corpus(corpus, "jsonl", out, config)
    finally:
        handle.shutdown()
    text_bytes = int(plan.grouping["text_bytes"])
    return {
        "docs": n_docs,
        "units": int(plan.grouping["n_units"]),
        "wall_s": round(time.perf_counter() - t0, 1),
        "timings_s": {k: round(v, 1) for k, v in report["timings_s"].items()},
        "driver_base_mb": round(mem.base_mb, 1),
        "driver_peak_mb": round(mem.peak_mb, 1),
        "driver_extra_mb": round(mem.extra_mb, 1),
        "driver_extra_mb_per_1k_docs": round(mem.extra_mb / n_docs * 1000, 3),
        "unit_text_mb": round(text_bytes / 2**20, 1),
        "unit_text_mb_per_1k_docs": round(text_bytes / 2**20 / n_docs * 1000, 3),
        "documents_artifact_mb": round(sum(p.bytes for p in corpus_art.parts) / 2**20, 1),
    }


def driver_memory(sizes: list[int], cpus: int, seed: int, text_scale: int = 0) -> list[dict[str, Any]]:
    """One generated corpus and one fresh driver process per size; with ``text_scale``, the smallest
    size once more with texts ``text_scale`` times longer (same documents, titles and links: the same
    metadata), the control that tells metadata from text."""
    import subprocess
    import tempfile

    from lab.synthetic.wikigraph import write_wikilike_corpus

    rows = []
    runs = [(n, 1) for n in sizes] + ([(sizes[0], text_scale)] if text_scale > 1 else [])
    for n, scale in runs:
        with tempfile.TemporaryDirectory(prefix="bench-scale-corpus-") as tmp:
            log(f"driver memory: generating {n:,} documents (text x{scale}) ...")
            write_wikilike_corpus(tmp, n, n_files=max(2, min(16, n // 20_000)), seed=seed, chars_per_token=4.0 * scale)
            log(f"driver memory: planning {n:,} documents in a fresh driver ...")
            proc = subprocess.run([sys.executable, "-m", "jobs.bench", "scale", "--_driver-run", tmp, "--_driver-docs", str(n),
                                   "--cpus", str(cpus)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"driver run for {n} documents failed:\n{proc.stderr[-3000:]}")
            rows.append({**json.loads(proc.stdout.strip().splitlines()[-1]), "text_scale": scale})
            log(json.dumps(rows[-1]))
    return rows


# ---------------------------------------------------------------------------------------- embedding
def embedding_throughput(n_chunks: int, cpus: int, seed: int, pools: list[str]) -> dict[str, Any]:
    """Raw ``SentenceTransformer.encode`` vs the Ray Data pool on the same ``cpus`` and model."""
    import torch

    from longrag.config import EmbeddingConfig
    from longrag.index.embedding import Embedder

    texts = embed_texts(n_chunks, seed)
    emb = EmbeddingConfig()
    torch.set_num_threads(cpus)
    embedder = Embedder(emb)
    embedder.encode_passages(texts[: emb.batch_size])  # warm-up
    load_raw = os.getloadavg()[0]
    t0 = time.perf_counter()
    raw_vecs = embedder.encode_passages(texts)
    raw_s = time.perf_counter() - t0
    del embedder
    out: dict[str, Any] = {"chunks": n_chunks, "cpus": cpus, "torch_threads_raw": cpus,
                           "raw_chunks_per_s": round(n_chunks / raw_s, 2), "raw_load_avg_1m": round(load_raw, 2),
                           "pools": []}
    log(f"embedding: raw encode {n_chunks / raw_s:.1f} chunks/s on {cpus} threads")
    import ray

    from actors.embedding import embed, pool_options
    from cluster.local import start_or_join

    handle = start_or_join(None, num_cpus=cpus)
    try:
        for spec in pools:
            cfg = emb if spec == "auto" else emb.model_copy(update=dict(zip(
                ("concurrency", "torch_threads"), (int(x) for x in spec.split("x")))))
            opts = pool_options(cfg)
            ds = ray.data.from_items([{"i": i, "text": t} for i, t in enumerate(texts)],
                                     override_num_blocks=max(1, n_chunks // emb.batch_size))
            ds = embed(ds, cfg, opts=opts)
            t0 = time.perf_counter()
            stamps, vecs, ids = [], [], []
            for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
                stamps.append((time.perf_counter(), len(b["i"])))
                ids.extend(b["i"].tolist())
                vecs.append(np.stack(b["vector"]))
            total_s = time.perf_counter() - t0
            order = np.argsort(np.asarray(ids))
            max_diff = float(np.abs(np.concatenate(vecs)[order] - raw_vecs).max())
            actors = opts["compute"].max_size
            first = stamps[min(actors, len(stamps)) - 1][0]  # each actor's first batch is done
            rest = sum(n for t, n in stamps[actors:])
            steady = rest / max(stamps[-1][0] - first, 1e-9) if rest else n_chunks / total_s
            row = {"pool": spec, "actors": actors, "torch_threads": opts["fn_constructor_kwargs"]["torch_threads"],
                   "num_cpus_per_actor": opts["num_cpus"], "chunks_per_s_steady": round(steady, 2),
                   "chunks_per_s_end_to_end": round(n_chunks / total_s, 2),
                   "ratio_steady": round(steady / (n_chunks / raw_s), 3),
                   "ratio_end_to_end": round((n_chunks / total_s) / (n_chunks / raw_s), 3),
                   "max_abs_vector_diff": max_diff, "load_avg_1m": round(os.getloadavg()[0], 2)}
            out["pools"].append(row)
            log(f"embedding: Ray Data pool {spec}: {json.dumps(row)}")
    finally:
        handle.shutdown()
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--grouping-sizes", type=int_list(min_value=1000, min_len=2), default=[100_000, 1_000_000],
                   help="documents per grouping run, comma-separated, increasing (default 100000,1000000)")
    p.add_argument("--mean-links", type=number(float, min_value=0.0), default=10.0,
                   help="outgoing links per generated article (default 10: 1M documents -> 10M links)")
    p.add_argument("--budget", type=number(int, min_value=1), default=4096, help="group token budget")
    p.add_argument("--seed", type=number(int, min_value=0), default=0)
    p.add_argument("--target-s", type=number(float, min_value=0.0), default=30.0,
                   help="the goal for 1M documents / 10M links on one core, CPU seconds (default 30)")
    p.add_argument("--driver-memory-sizes", type=int_list(min_value=1000), default=[],
                   help="generated corpus sizes for the driver-memory runs, e.g. 10000,100000,300000 (default: none)")
    p.add_argument("--text-scale-control", type=number(int, min_value=0), default=0,
                   help="rerun the smallest driver-memory size with texts N times longer, same metadata (e.g. 4)")
    p.add_argument("--embed-chunks", type=number(int, min_value=0), default=0,
                   help="chunks for the embedding throughput comparison (default 0: skipped; e.g. 1200)")
    p.add_argument("--embed-pools", default="auto",
                   help="Ray Data pools to measure, comma-separated: auto (sized from the CPUs) or "
                        "ACTORSxTHREADS such as 1x2 (default auto)")
    p.add_argument("--cpus", type=number(int, min_value=1), default=os.cpu_count() or 1,
                   help="CPUs for the Ray runs and raw encode (default: this machine's)")
    p.add_argument("--_driver-run", dest="driver_run", help=argparse.SUPPRESS)
    p.add_argument("--_driver-docs", dest="driver_docs", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    pools = [x.strip() for x in args.embed_pools.split(",") if x.strip()]
    bad = [x for x in pools if x != "auto" and not (len(x.split("x")) == 2 and all(v.isdigit() and int(v) > 0 for v in x.split("x")))]
    if bad or not pools:
        p.error(f"--embed-pools: {bad[0] if bad else args.embed_pools!r} is not 'auto' or ACTORSxTHREADS (e.g. 2x1)")
    args.embed_pools = pools
    if args.grouping_sizes != sorted(args.grouping_sizes) or len(set(args.grouping_sizes)) < 2:
        p.error("--grouping-sizes: give at least two distinct sizes in increasing order")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.driver_run:  # the child process of a driver-memory run
        print(json.dumps(driver_memory_run(args.driver_run, args.driver_docs, args.cpus)))
        return 0
    rows = []
    for n in args.grouping_sizes:
        log(f"grouping {n:,} documents ...")
        rows.append(grouping_run(n, args.mean_links, args.budget, args.seed))
    cols = ["docs", "links", "csr_s", "group_s", "wall_s", "cpu_s", "driver_extra_mb", "driver_peak_extra_mb",
            "peak_bytes_per_link", "groups", "docs_per_unit"]
    print(markdown_table(rows, cols))
    proj = project(rows, WIKIPEDIA_ARTICLES)
    print(f"projected for {proj['docs']:,} articles: {proj['cpu_s']} CPU s (log-log slope {proj['slope']})")
    memory = (driver_memory(args.driver_memory_sizes, args.cpus, args.seed, args.text_scale_control)
              if args.driver_memory_sizes else [])
    if memory:
        cols = ["docs", "text_scale", "units", "wall_s", "driver_extra_mb", "driver_extra_mb_per_1k_docs", "unit_text_mb",
                "unit_text_mb_per_1k_docs"]
        print(markdown_table(memory, cols))
    embed = embedding_throughput(args.embed_chunks, args.cpus, args.seed, args.embed_pools) if args.embed_chunks else None
    at_1m = next((r for r in rows if r["docs"] == 1_000_000), None)
    summary = {
        "bench": "scale",
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "grouping": rows,
        "grouping_6m_projection": proj,
        "grouping_1m_cpu_s_over_target": round(at_1m["cpu_s"] / args.target_s, 3) if at_1m else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if memory:
        summary["driver_memory"] = memory
        plain = [r for r in memory if r["text_scale"] == 1]
        big, small = plain[-1], plain[0]
        # extra driver MB per extra 1K documents between the smallest and largest run, vs the text
        slope = (big["driver_extra_mb"] - small["driver_extra_mb"]) / max(big["docs"] - small["docs"], 1) * 1000
        summary["driver_mb_per_1k_docs_slope"] = round(slope, 3)
        summary["driver_growth_over_text_ratio"] = round(slope / max(big["unit_text_mb_per_1k_docs"], 1e-9), 4)
        control = next((r for r in memory if r["text_scale"] > 1), None)
        if control:  # same metadata, N times the text: driver memory should not follow the text
            summary["driver_extra_mb_text_scaled_over_plain"] = round(control["driver_extra_mb"] / max(small["driver_extra_mb"], 1e-9), 3)
            summary["text_scaled_over_plain"] = round(control["unit_text_mb"] / max(small["unit_text_mb"], 1e-9), 3)
    if embed:
        summary["embedding"] = embed
        auto = next((r for r in embed["pools"] if r["pool"] == "auto"), embed["pools"][0])
        summary["embedding_ray_over_raw_ratio"] = auto["ratio_steady"]
        summary["embedding_ray_over_raw_ratio_end_to_end"] = auto["ratio_end_to_end"]
    print(json.dumps(summary))
    return 0
