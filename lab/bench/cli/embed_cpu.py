"""EmbeddingGemma's precision and backend settings on a CPU against MiniLM: one row per setting with build
chunks/s, query-encode latency at c=1, peak RSS and paragraph-level retrieval recall on a MuSiQue subset,
plus recall and index bytes per Matryoshka dimension.

    python -m jobs.bench embed-cpu                         # every setting, 30 questions (~20 min on 2 cores)
    python -m jobs.bench embed-cpu --settings minilm,int8 --questions 10 --chunks 16

Each setting runs in a process of its own (``--one NAME``, so its peak RSS is its own), through the product's
``Embedder`` (``embedding.dtype`` / ``quantize`` / ``backend``), with ``--threads`` torch threads:

* build: ``--chunks`` chunk-sized texts (two DPR passages joined, ~280 tokens: :func:`lab.bench.texts.chunk_texts`,
  as ``jobs.bench embed`` makes them; MiniLM truncates them to its 256 tokens) encoded after one warm-up batch;
* query: each of the subset's questions encoded alone (``encode_queries([q])``, what the serving
  ``QueryEncoder`` does for a lone request), p50/p95 after a warm-up;
* recall: the distinct paragraphs of the first ``--questions`` MuSiQue questions pooled (each paragraph a unit,
  ``"title\\ntext"``), ranked by cosine to the question; R@k = all the question's gold titles in the top k
  (``longrag.eval.metrics.gold_recall_at_k``), AR@k = an answer in the top k texts (``answer_recall_at_k``);
  the paragraphs' encode time is reported too;
* a ~1,200-token text (past Gemma's 512-token sliding window) whose vector is compared with fp32's.

Vectors are compared with the fp32 row's (cosine). ``--matryoshka SETTINGS`` cuts those settings' vectors to 512 /
256 / 128 (renormalized, as ``embedding.dim`` does) and scores them again, beside the bytes of a flat FAISS index
of the paragraphs. Writes ``--out``/table.md and summary.json; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from lab.bench.tables import markdown_table, publish
from lab.bench.texts import chunk_texts
from longrag.cli import choice_list, job_setup, number
from longrag.eval import metrics as M

GEMMA = "embeddinggemma-300m"
SETTINGS: dict[str, dict[str, Any]] = {
    "minilm": {"model": "all-MiniLM-L6-v2"},
    "fp32": {"model": GEMMA},
    "bf16": {"model": GEMMA, "dtype": "bfloat16"},
    "int8": {"model": GEMMA, "quantize": "int8"},
    "openvino": {"model": GEMMA, "backend": "openvino"},
    "openvino-bf16": {"model": GEMMA, "backend": "openvino", "dtype": "bfloat16"},
}
KS = (1, 2, 5, 10)
DIMS = (768, 512, 256, 128)
DATA = "data/musique/musique_train100.json.gz"


def subset(questions: int, data: str) -> tuple[list[Any], list[Any]]:
    """The first ``questions`` MuSiQue examples and their distinct paragraphs (one document each)."""
    from longrag.eval.corpus import pool_paragraphs
    from longrag.eval.datasets import iter_paragraphs, load_qa
    from longrag.eval.plan import DATASET_FORMATS

    examples = load_qa(data, DATASET_FORMATS["musique"]).examples[:questions]
    return examples, pool_paragraphs(iter_paragraphs(examples), "separate").documents


def recall(queries: np.ndarray, paragraphs: np.ndarray, examples: list[Any], docs: list[Any]) -> dict[str, float]:
    """Mean R@k and AR@k (percent) of ranking ``docs`` by inner product."""
    order = np.argsort(-(queries @ paragraphs.T), axis=1, kind="stable")[:, : max(KS)]
    rows: dict[str, list[float]] = {}
    for ex, top in zip(examples, order):
        for k, v in M.gold_recall_at_k([[docs[i].title] for i in top], ex.gold_titles, KS).items():
            rows.setdefault(f"R@{k}", []).append(v)
        for k, v in M.answer_recall_at_k([docs[i].text for i in top], ex.answers, KS).items():
            rows.setdefault(f"AR@{k}", []).append(v)
    return {key: round(100 * float(np.mean(v)), 1) for key, v in rows.items()}


def cut(vectors: np.ndarray, dim: int) -> np.ndarray:
    """Matryoshka: the first ``dim`` components, renormalized."""
    v = np.ascontiguousarray(vectors[:, :dim])
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def one(args: argparse.Namespace) -> int:
    """Measure one setting in this process; vectors to ``--out``/vectors-NAME.npz, a JSON line to stdout."""
    import torch

    from longrag.config import EmbeddingConfig
    from longrag.index.embedding import Embedder

    torch.set_num_threads(args.threads)
    examples, docs = subset(args.questions, args.data)
    chunks = chunk_texts(args.chunks)
    long_text = " ".join(chunk_texts(8, 1))
    t0 = time.perf_counter()
    embedder = Embedder(EmbeddingConfig(device="cpu", vector_cache=False, **SETTINGS[args.one]))
    load_s = time.perf_counter() - t0
    embedder.encode_passages(chunks[: embedder.config.batch_size])  # warm-up
    t0 = time.perf_counter()
    chunk_vecs = embedder.encode_passages(chunks)
    chunk_s = time.perf_counter() - t0
    embedder.encode_queries(["a warm-up question"])
    latencies, query_vecs = [], []
    for ex in examples:
        t0 = time.perf_counter()
        query_vecs.append(embedder.encode_queries([ex.question])[0])
        latencies.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    para_vecs = embedder.encode_passages([f"{d.title}\n{d.text}" for d in docs])
    para_s = time.perf_counter() - t0
    long_vec = embedder.encode_passages([long_text])
    queries = np.stack(query_vecs)
    np.savez(Path(args.out) / f"vectors-{args.one}.npz", chunks=chunk_vecs, queries=queries, paragraphs=para_vecs,
             long=long_vec)
    tokens = embedder.count_tokens(chunks[:50])
    print(json.dumps({
        "setting": args.one, **SETTINGS[args.one], "repr": repr(embedder), "load_s": round(load_s, 1),
        "chunk_tokens_mean": round(float(np.mean(tokens)), 1), "chunks": len(chunks),
        "chunks_per_s": round(len(chunks) / chunk_s, 2), "paragraphs": len(docs),
        "paragraphs_per_s": round(len(docs) / para_s, 2), "paragraphs_encode_s": round(para_s, 1),
        "query_p50_ms": round(1e3 * float(np.percentile(latencies, 50)), 1),
        "query_p95_ms": round(1e3 * float(np.percentile(latencies, 95)), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        **recall(queries, para_vecs, examples, docs)}))
    return 0


def compare(rows: list[dict[str, Any]], out: Path) -> None:
    """Each Gemma row's vectors against the fp32 row's: least cosine over chunks, paragraphs, the long text."""
    path = out / "vectors-fp32.npz"
    if not path.exists():
        return
    ref = np.load(path)
    for row in rows:
        if row["model"] == GEMMA:
            vec = np.load(out / f"vectors-{row['setting']}.npz")
            row["min_cos_vs_fp32"] = round(float(min(np.min(np.sum(vec[k] * ref[k], axis=1))
                                                     for k in ("chunks", "paragraphs", "long"))), 4)
            row["long_cos_vs_fp32"] = round(float(vec["long"][0] @ ref["long"][0]), 4)


def matryoshka(setting: str, out: Path, examples: list[Any], docs: list[Any]) -> list[dict[str, Any]]:
    """Recall and flat-index bytes of one setting's vectors cut to each Matryoshka dimension."""
    import faiss

    vec = np.load(out / f"vectors-{setting}.npz")
    rows = []
    for dim in DIMS:
        paragraphs = cut(vec["paragraphs"], dim)
        index = faiss.IndexFlatIP(dim)
        index.add(paragraphs)
        rows.append({"setting": setting, "dim": dim, "index_bytes": int(faiss.serialize_index(index).nbytes),
                     "bytes_per_vector": 4 * dim, **recall(cut(vec["queries"], dim), paragraphs, examples, docs)})
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.bench embed-cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", type=choice_list(tuple(SETTINGS)), default=list(SETTINGS),
                   help=f"comma list of {', '.join(SETTINGS)} (fp32 is the vectors' reference)")
    p.add_argument("--questions", type=number(int, min_value=1), default=30, help="MuSiQue questions (their paragraphs pooled)")
    p.add_argument("--data", default=DATA)
    p.add_argument("--chunks", type=number(int, min_value=1), default=48, help="chunk-sized texts for chunks/s")
    p.add_argument("--threads", type=number(int, min_value=1), default=os.cpu_count() or 1, help="torch threads")
    p.add_argument("--matryoshka", type=choice_list(tuple(SETTINGS)), default=["fp32", "openvino"],
                   help="the settings whose vectors are cut to 512/256/128 (comma list)")
    p.add_argument("--out", default="reports/bench-embed-cpu")
    p.add_argument("--one", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    job_setup()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        return one(args)
    load_start, t_start = [round(x, 2) for x in os.getloadavg()], time.perf_counter()
    rows: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for name in args.settings:
        cmd = [sys.executable, "-m", "jobs.bench", "embed-cpu", "--one", name, "--questions", str(args.questions),
               "--data", args.data, "--chunks", str(args.chunks), "--threads", str(args.threads), "--out", str(out)]
        print(f"{name} ...", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:  # the others still run; the row says so
            print(f"error: setting {name} failed (exit {done.returncode})", file=sys.stderr)
            failed.append({"setting": name, **SETTINGS[name], "failed": f"exit {done.returncode}"})
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if not rows:
        return 1
    compare(rows, out)
    base = next((r for r in rows if r["setting"] == "minilm"), None)
    for row in rows:
        if base is not None:
            row["chunk_cost_x_minilm"] = round(base["chunks_per_s"] / row["chunks_per_s"], 2)
            row["query_p50_x_minilm"] = round(row["query_p50_ms"] / base["query_p50_ms"], 2)
    cols = ["setting", "chunks_per_s", "chunk_cost_x_minilm", "paragraphs_per_s", "query_p50_ms", "query_p50_x_minilm",
            "peak_rss_mb", "R@2", "R@5", "R@10", "AR@2", "AR@5", "AR@10", "min_cos_vs_fp32", "long_cos_vs_fp32"]
    table = markdown_table(rows + failed, cols + (["failed"] if failed else []))
    dims: list[dict[str, Any]] = []
    cuts = [name for name in args.matryoshka if name in {r["setting"] for r in rows} and name != "minilm"]
    if cuts:
        examples, docs = subset(args.questions, args.data)
        dims = [row for name in cuts for row in matryoshka(name, out, examples, docs)]
        table += "\n\n" + markdown_table(dims, ["setting", "dim", "bytes_per_vector", "index_bytes", "R@2", "R@5",
                                                "R@10", "AR@2", "AR@5", "AR@10"])
    summary = {"questions": args.questions, "paragraphs": rows[0]["paragraphs"], "threads": args.threads,
               "cpu": _cpu(), "loadavg_start": load_start, "loadavg_end": [round(x, 2) for x in os.getloadavg()],
               "wall_s": round(time.perf_counter() - t_start, 1), "settings": rows, "failed": failed,
               "matryoshka": dims}
    publish(out, table, summary)
    return 0


def _cpu() -> str:
    try:
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return ""
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{len(names)} x {names[0] if names else '?'} ({', '.join(isa)})"
