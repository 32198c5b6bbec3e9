"""MixPR benchmark: speed of chunk + TF-IDF + graph + PageRank + top-k at 128K / 1M (/ 4M) tokens,
PageRank vs networkx on the same graph, peak memory, then retrieval recall@k of MixPR vs RAG-Sparse
vs RAG-Hybrid on HashHop (2-6 hops) and BABILong-style qa2/qa3, then MixPR vs RAG-Sparse on the same
HashHop facts written in several document formats (one per line with and without periods, lower-case
line starts, bulleted and numbered lists, prose paragraphs). Ends with one JSON line.

    python -m jobs.bench mixpr                  # defaults: timing at 128K and 1M, recall at 32K/128K, 3 seeds
                                                # (RAG-Hybrid: 1 seed, MiniLM with 2 torch threads, batch 128)
    python -m jobs.bench mixpr --with-4m        # also time a 4M-token document
    python -m jobs.bench mixpr --skip-recall --skip-formats --timing-sizes 1000000 --repeats 5
                                                # each stage: the fastest of 5 runs
    python -m jobs.bench mixpr --skip-timing --skip-recall        # only the document-format table

Plain Python, no Ray. Token counts are estimates (characters / 4), see lab.synthetic.common.
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

from lab.synthetic import generate_babilong, generate_hashhop, needle_recall
from lab.synthetic.babilong import TASK_FILES
from lab.synthetic.hashhop import HASHHOP_FORMATS
from longrag.cli import choice_list, int_list, number
from longrag.mixpr import MixPRConfig, MixPRRetriever, SparseRetriever, prepare_document
from longrag.mixpr.baselines import HybridRetriever
from longrag.mixpr.graph import similarity_graph
from longrag.mixpr.pagerank import personalized_pagerank

MAX_HOPS = 16
TIMING_DOCS = ("babilong", "hashhop")
DEFAULT_TASKS = "hashhop_2,hashhop_3,hashhop_4,hashhop_5,hashhop_6,babilong_qa2,babilong_qa3"
BABILONG_TASKS = tuple(f"babilong_{t}" for t in sorted(TASK_FILES, key=lambda t: int(t[2:])))
TASKS_HELP = f"hashhop_N (N = 1..{MAX_HOPS} hops), " + ", ".join(BABILONG_TASKS)


def _is_hashhop_task(name: str) -> bool:
    prefix, _, hops = name.partition("_")
    return prefix == "hashhop" and hops.isdigit() and 1 <= int(hops) <= MAX_HOPS


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def make_doc(kind: str, tokens: int, seed: int):
    if kind == "babilong":
        return generate_babilong("qa2", tokens, seed)
    if kind == "hashhop":
        return generate_hashhop(tokens, 4, seed)
    raise ValueError(kind)


def time_one(kind: str, tokens: int, cfg: MixPRConfig, nx_max_edges: int, repeats: int = 1) -> dict[str, Any]:
    """One timing row; with ``repeats`` > 1 each stage (and the wall time) is the fastest of the runs.
    ``load1``: the machine's 1-minute load average when the runs ended (other work slows them)."""
    s = make_doc(kind, tokens, seed=0)
    r = MixPRRetriever(cfg)
    best: dict[str, float] = {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = r.retrieve_with_trace(s.document, s.question, route="local")
        times = {**res.timings, "wall": time.perf_counter() - t0}
        best = {k: min(v, best.get(k, v)) for k, v in times.items()}
    row: dict[str, Any] = {
        "doc": kind, "tokens": tokens, "chunks": res.n_chunks, "distinct": res.n_distinct, "edges": res.n_edges,
        "iters": res.iterations, **{k: round(v, 4) for k, v in best.items()}, "repeats": repeats,
        "load1": round(os.getloadavg()[0], 2), "peak_rss_mb": round(peak_rss_mb(), 1),
    }  # fmt: skip
    # PageRank vs networkx on the same graph (distinct-chunk graph, p on the query rows)
    prep = prepare_document(s.document, s.question, cfg)
    emb = prep.embedding
    S, stats = similarity_graph(emb.matrix, cfg.threshold)
    m = S.shape[0]
    p = np.zeros(m)
    np.add.at(p, emb.classes[prep.query], prep.query_weights)
    t0 = time.perf_counter()
    ours = personalized_pagerank(S, p, cfg.alpha_local, max_iter=100, tol=1e-10)
    t_ours = time.perf_counter() - t0
    row["ppr_converged_s"] = round(t_ours, 4)
    row["ppr_converged_iters"] = ours.n_iter
    if stats.n_edges <= nx_max_edges:
        import networkx as nx

        t0 = time.perf_counter()
        G = nx.from_scipy_sparse_array(S.astype(np.float64), create_using=nx.DiGraph)
        t_build = time.perf_counter() - t0
        pers = {int(i): float(p[i]) for i in np.flatnonzero(p)}
        t0 = time.perf_counter()
        ref = nx.pagerank(G, alpha=1 - cfg.alpha_local, personalization=pers, tol=1e-10 / m, max_iter=1000)
        t_nx = time.perf_counter() - t0
        ref_v = np.array([ref[i] for i in range(m)])
        row.update(
            nx_build_s=round(t_build, 4), nx_pagerank_s=round(t_nx, 4), nx_ratio=round(t_nx / max(t_ours, 1e-9), 1),
            nx_max_abs_diff=float(np.abs(ref_v - ours.scores).max()),
        )  # fmt: skip
        del G
    return row


def recall_rows(tasks, sizes, seeds, cfg, hybrid, hybrid_max_tokens, hybrid_seeds) -> list[dict[str, Any]]:
    mix, sparse = MixPRRetriever(cfg), SparseRetriever(cfg)
    rows = []
    for task in tasks:
        for tokens in sizes:
            for seed in range(seeds):
                if task.startswith("hashhop"):
                    s = generate_hashhop(tokens, int(task.split("_")[1]), seed)
                else:
                    s = generate_babilong(task.split("_")[1], tokens, seed)
                prep = prepare_document(s.document, s.question, cfg)
                st, en = prep.chunks.starts[: prep.n_doc], prep.chunks.ends[: prep.n_doc]

                def rec(res):
                    return needle_recall(s.needles, st, en, [c.position for c in res.chunks])

                row = {"task": task, "tokens": tokens, "seed": seed, "chunks": prep.n_doc}
                row["mixpr"] = rec(mix.rank(prep, "local"))
                row["sparse"] = rec(sparse.rank(prep))
                if hybrid is not None and tokens <= hybrid_max_tokens and seed < hybrid_seeds:
                    row["hybrid"] = rec(hybrid.rank(prep))
                rows.append(row)
                log(f"  recall {task} {tokens} seed {seed}: " + ", ".join(f"{k}={row[k]:.2f}" for k in ("mixpr", "sparse", "hybrid") if k in row))
    return rows


def format_rows(formats, sizes, hops_list, seeds, cfg) -> list[dict[str, Any]]:
    """Recall of MixPR and RAG-Sparse on the same HashHop chains written in each document format."""
    mix, sparse = MixPRRetriever(cfg), SparseRetriever(cfg)
    rows = []
    for fmt in formats:
        for tokens in sizes:
            for hops in hops_list:
                for seed in range(seeds):
                    s = generate_hashhop(tokens, hops, seed, fmt=fmt)
                    prep = prepare_document(s.document, s.question, cfg)
                    st, en = prep.chunks.starts[: prep.n_doc], prep.chunks.ends[: prep.n_doc]
                    res = mix.rank(prep, "local")
                    row = {
                        "format": fmt, "tokens": tokens, "hops": hops, "seed": seed, "chunks": prep.n_doc,
                        "mixpr": needle_recall(s.needles, st, en, [c.position for c in res.chunks]),
                        "sparse": needle_recall(s.needles, st, en, [c.position for c in sparse.rank(prep).chunks]),
                        "query_edges": res.query_edges,
                    }  # fmt: skip
                    rows.append(row)
                    log(f"  format {fmt} {tokens} hops {hops} seed {seed}: mixpr={row['mixpr']:.2f} "
                        f"sparse={row['sparse']:.2f} query_edges={row['query_edges']}")
    return rows


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m jobs.bench mixpr", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sizes = int_list(min_value=1)
    ap.add_argument("--timing-sizes", type=sizes, default=[128000, 1000000], help="comma-separated token counts")
    ap.add_argument("--timing-docs", type=choice_list(TIMING_DOCS), default=list(TIMING_DOCS),
                    help="babilong (Wikipedia prose) and/or hashhop")
    ap.add_argument("--with-4m", action="store_true", help="also time a 4M-token document (needs ~4+ GB RAM)")
    ap.add_argument("--repeats", type=number(int, min_value=1), default=1,
                    help="runs per timed document; each stage's seconds are the fastest run's")
    ap.add_argument("--recall-sizes", type=sizes, default=[32000, 128000], help="comma-separated token counts")
    ap.add_argument("--seeds", type=number(int, min_value=1), default=3)
    ap.add_argument("--tasks", type=choice_list(BABILONG_TASKS, accept=_is_hashhop_task, describe=TASKS_HELP),
                    default=DEFAULT_TASKS.split(","), help=f"comma-separated: {TASKS_HELP}")
    ap.add_argument("--hybrid", choices=["auto", "off"], default="auto", help="RAG-Hybrid needs sentence-transformers + faiss")
    ap.add_argument("--hybrid-max-tokens", type=number(int, min_value=0), default=128000,
                    help="skip the (slow, CPU) dense baseline above this")
    ap.add_argument("--hybrid-seeds", type=number(int, min_value=0), default=1, help="seeds that also run the dense baseline")
    ap.add_argument("--torch-threads", type=number(int, min_value=1), default=2,
                    help="torch threads of the dense encoder (RAG-Hybrid)")
    ap.add_argument("--embed-batch", type=number(int, min_value=1), default=128,
                    help="batch size of the dense encoder (RAG-Hybrid)")
    ap.add_argument("--nx-max-edges", type=number(int, min_value=0), default=3_000_000,
                    help="skip networkx above this many edges")
    ap.add_argument("--formats", type=choice_list(HASHHOP_FORMATS), default=list(HASHHOP_FORMATS),
                    help="document formats of the format table: " + ", ".join(HASHHOP_FORMATS))
    ap.add_argument("--format-sizes", type=sizes, default=[32000, 128000], help="token counts of the format table")
    ap.add_argument("--format-hops", type=int_list(min_value=1, max_value=MAX_HOPS), default=[2, 4, 6],
                    help="chain lengths of the format table")
    ap.add_argument("--format-seeds", type=number(int, min_value=1), default=3, help="seeds per format, size and hops")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-recall", action="store_true")
    ap.add_argument("--skip-formats", action="store_true")
    ap.add_argument("--top-k", type=number(int, min_value=1), default=100)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    cfg = MixPRConfig(top_k=args.top_k)
    out: dict[str, Any] = {"config": cfg.model_dump(), "cpus": os.cpu_count(), "timing": [], "recall": [], "formats": []}

    if not args.skip_timing:
        sizes = list(args.timing_sizes)
        if args.with_4m:
            sizes.append(4_000_000)
        docs = args.timing_docs
        # warm up imports / caches (filler loading, regex compilation) outside the timings
        MixPRRetriever(cfg).retrieve(make_doc("babilong", 4000, 0).document)
        for tokens in sizes:
            for kind in docs:
                log(f"timing {kind} {tokens} tokens ...")
                out["timing"].append(time_one(kind, tokens, cfg, args.nx_max_edges, args.repeats))
        cols = ["doc", "tokens", "chunks", "distinct", "edges", "iters", "chunk", "embed", "graph", "pagerank",
                "topk", "total", "ppr_converged_s", "nx_pagerank_s", "nx_ratio", "peak_rss_mb", "load1"]  # fmt: skip
        print(f"\n## MixPR speed (seconds; local route, k={cfg.top_k:d})")
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in out["timing"]:
            print("| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |")

    if not args.skip_recall:
        hybrid = None
        if args.hybrid == "auto":
            try:
                import faiss  # noqa: F401
                import torch

                from longrag.config import EmbeddingConfig
                from longrag.index.embedding import Embedder

                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                torch.set_num_threads(args.torch_threads)
                hybrid = HybridRetriever(Embedder(EmbeddingConfig(batch_size=args.embed_batch)), cfg)
            except Exception as exc:  # missing optional deps: say so, keep going
                log(f"RAG-Hybrid skipped: {type(exc).__name__}: {exc}")
                out["hybrid_skipped"] = f"{type(exc).__name__}: {exc}"
        tasks = args.tasks
        sizes = args.recall_sizes
        out["recall"] = recall_rows(tasks, sizes, args.seeds, cfg, hybrid, args.hybrid_max_tokens, args.hybrid_seeds)
        print(f"\n## Retrieval recall@{cfg.top_k} of supporting facts (mean over {args.seeds} seeds; RAG-Hybrid: {args.hybrid_seeds})")
        print("| task | tokens | MixPR | RAG-Sparse | RAG-Hybrid |")
        print("|---|---|---|---|---|")
        summary = []
        for task in tasks:
            for tokens in sizes:
                rs = [r for r in out["recall"] if r["task"] == task and r["tokens"] == tokens]
                agg = {k: float(np.mean([r[k] for r in rs if k in r])) if any(k in r for r in rs) else None
                       for k in ("mixpr", "sparse", "hybrid")}  # fmt: skip
                summary.append({"task": task, "tokens": tokens, **agg})
                fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
                print(f"| {task} | {tokens} | {fmt(agg['mixpr'])} | {fmt(agg['sparse'])} | {fmt(agg['hybrid'])} |")
        out["recall_summary"] = summary

    if not args.skip_formats:
        t0 = time.perf_counter()
        out["formats"] = format_rows(args.formats, args.format_sizes, args.format_hops, args.format_seeds, cfg)
        wall = time.perf_counter() - t0
        hops = ",".join(map(str, args.format_hops))
        print(f"\n## Recall@{cfg.top_k} by document format: MixPR / RAG-Sparse (HashHop, {hops} hops x "
              f"{args.format_seeds} seeds per cell; {wall:.0f} s)")
        print("| format | " + " | ".join(f"{t} tokens" for t in args.format_sizes) + " | layout |")
        print("|---|" + "---|" * len(args.format_sizes) + "---|")
        fsum = []
        for fmt in args.formats:
            cells = []
            for tokens in args.format_sizes:
                rs = [r for r in out["formats"] if r["format"] == fmt and r["tokens"] == tokens]
                agg = {k: float(np.mean([r[k] for r in rs])) for k in ("mixpr", "sparse")}
                agg["min_query_edges"] = int(min(r["query_edges"] for r in rs))
                fsum.append({"format": fmt, "tokens": tokens, **agg})
                cells.append(f"{agg['mixpr']:.2f} / {agg['sparse']:.2f}")
            print(f"| {fmt} | " + " | ".join(cells) + f" | {HASHHOP_FORMATS[fmt][0]} |")
        out["formats_summary"] = fsum
        out["formats_wall_s"] = round(wall, 1)
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    print(json.dumps(out, default=float))
    return 0
