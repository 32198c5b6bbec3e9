"""Embedding throughput: chunks per second of the product's encoder (``longrag.index.embedding.Embedder``,
what every embedding actor of an index build runs) on a device, per batch size and dtype.

    python -m jobs.bench embed                                   (the bundled MiniLM on this machine)
    python -m jobs.bench embed --device cuda --dtypes float32,float16 --batch-sizes 32,128,512
    python -m jobs.bench embed --set embedding.model=/models/bge-large-en-v1.5 --device cuda
    python -m jobs.bench embed --random-shape bge-large --passages-per-chunk 4 --device cuda --dtypes float32,float16

The texts are the bundled DPR passages joined two by two (~270 tokens each; ``--passages-per-chunk``):
every text fills the encoder's input the way the chunker's chunks do (``chunking`` cuts units to the model's
limit). Each (dtype, batch) level encodes ``--chunks`` texts after one warm-up batch; the figure
is chunks per second of wall time, with the vectors checked against the first level's (cosine),
beside the rate of tokenizing alone (the host's part of ``encode``: a small model on a GPU waits on it).
This is the figure the cluster plan needs: chunks per second per GPU times the GPUs gives an
index build's embedding time (docs/autoscaling.md). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from lab.bench import machine
from lab.bench.texts import chunk_texts as texts
from longrag.cli import add_config_flags, choice_list, config_from_args, int_list, job_setup, number

DTYPES = ("auto", "float32", "float16", "bfloat16")


SHAPES = {"bge-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                           max_position_embeddings=512)}
"""Encoder shapes measurable without their weights (``--random-shape``): speed does not depend on them."""


def random_shape_model(shape: str, folder: Path) -> Path:
    """A sentence-transformers folder with a BERT of ``shape`` (e.g. bge-large-en-v1.5's: 24 layers,
    1,024 wide, 512 tokens) and random weights, using the bundled MiniLM's BERT-uncased tokenizer."""
    import shutil

    from transformers import BertConfig, BertModel

    from longrag.index.embedding import bundled_minilm_path

    src = bundled_minilm_path()
    shutil.copytree(src, folder, ignore=lambda d, names: [n for n in names if Path(d) == src
                                                            and n in ("model.safetensors", "config.json")])
    cfg = SHAPES[shape]
    BertModel(BertConfig(vocab_size=30522, **cfg)).save_pretrained(folder)
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": cfg["max_position_embeddings"], "do_lower_case": True}))
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    pooling["word_embedding_dimension"] = cfg["hidden_size"]
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return folder


def level(embedder: Any, chunks: list[str], batch: int) -> tuple[dict[str, Any], np.ndarray]:
    embedder.config = embedder.config.model_copy(update={"batch_size": batch})
    embedder.encode_passages(chunks[:batch])  # warm-up: kernels, allocator
    sync = _synchronizer(embedder.device)
    sync()
    t0 = time.perf_counter()
    vectors = embedder.encode_passages(chunks)
    sync()
    wall = time.perf_counter() - t0
    return {"batch": batch, "chunks": len(chunks), "wall_s": round(wall, 3),
            "chunks_per_s": round(len(chunks) / wall, 1)}, vectors


def tokenize_rate(embedder: Any, chunks: list[str]) -> float:
    """Chunks per second of tokenizing alone, as ``encode`` does it: the host's share of embedding."""
    preprocess = getattr(embedder.model, "preprocess", None) or embedder.model.tokenize  # sentence-transformers 6 / 5
    t0 = time.perf_counter()
    for lo in range(0, len(chunks), 512):
        preprocess(chunks[lo:lo + 512])
    return round(len(chunks) / (time.perf_counter() - t0), 1)


def _synchronizer(device: str):
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.bench embed", description=__doc__.split("\n\n")[0])
    add_config_flags(p)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: embedding.device, auto)")
    p.add_argument("--dtypes", type=choice_list(DTYPES), default=["float32"], help=f"comma list of {DTYPES}")
    p.add_argument("--batch-sizes", type=int_list(min_value=1), default=[32], help="comma list")
    p.add_argument("--chunks", type=number(int, min_value=1), default=2000, help="texts per level")
    p.add_argument("--passages-per-chunk", type=number(int, min_value=1, max_value=100), default=2,
                   help="DPR passages (~130 tokens each) joined into one text: 2 fills MiniLM's 256, 4 a 512-token model")
    p.add_argument("--random-shape", choices=sorted(SHAPES), default=None,
                   help="measure an encoder of this shape with random weights instead of embedding.model")
    p.add_argument("--torch-threads", type=number(int, min_value=1), default=None, help="CPU threads (default torch's)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    job_setup()
    try:
        config = config_from_args(args, {"device": "embedding.device"})
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    chunks = texts(args.chunks, args.passages_per_chunk)
    if args.random_shape:
        import shutil
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix="bench-embed-"))
        try:
            folder = random_shape_model(args.random_shape, tmp / args.random_shape)
            config = config.model_copy(update={"embedding": config.embedding.model_copy(update={"model": str(folder)})})
            return run(args, config, chunks)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return run(args, config, chunks)


def run(args: argparse.Namespace, config: Any, chunks: list[str]) -> int:
    import torch

    from longrag.index.embedding import Embedder

    rows, reference, device, n_tok, tokenize_per_s = [], None, "", [], 0.0
    for dtype in args.dtypes:
        embedder = Embedder(config.embedding.model_copy(update={"dtype": dtype}))
        device = embedder.device
        if not n_tok:  # the tokenizer is the same whatever the dtype: measured once
            n_tok = embedder.count_tokens(chunks[:200])
            tokenize_per_s = tokenize_rate(embedder, chunks)
        for batch in args.batch_sizes:
            row, vectors = level(embedder, chunks, batch)
            if reference is None:
                reference = vectors
            row.update(dtype=embedder.dtype, tokenize_only_chunks_per_s=tokenize_per_s,
                       min_cosine_vs_first=round(float(np.min(np.sum(vectors * reference, axis=1))), 5))
            rows.append(row)
            print(f"{dtype:>9} batch {batch:>4}: {row['chunks_per_s']:>9.1f} chunks/s "
                  f"(cosine to the first level >= {row['min_cosine_vs_first']})", flush=True)
        del embedder
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(json.dumps({"model": config.embedding.model, "device": device, "gpu": gpu,
                      "tokens_per_chunk_mean": round(float(np.mean(n_tok)), 1), "levels": rows,
                      "machine": machine()}))
    return 0
