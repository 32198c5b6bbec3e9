"""Answer a question over one long document from the command line with Mixture-of-PageRanks retrieval
(Alonso and Millidge, 2024, "Mixture-of-PageRanks: Replacing Long-Context with Real-Time, Sparse GraphRAG"),
or with a strategy of dual-perspective LongRAG (Zhao et al., 2024, "LongRAG: A Dual-Perspective
Retrieval-Augmented Generation Paradigm for Long-Context Question Answering", Section 5.3).

    python -m jobs.longcontext --document book.txt --question "Who wrote the letter?" --json
    python -m jobs.longcontext --document doc.txt --question "..." --retriever sparse --k 50 --route local \\
        --retrieve-only --json
    python -m jobs.longcontext --document doc.txt --question "..." --strategy E&F --json \\
        --set dual.reranker=artifacts/rerankers/minilm-reranker-v1

With ``--strategy`` (R&B, R&L, Ext, Fil or E&F) the document is split at blank lines into paragraphs,
chunked into sentences (``dual.chunk_words``), retrieved densely with the bundled encoder and reranked by
``dual.reranker`` (none: the trace says "dense only") to ``--k`` (default ``dual.rerank_k``), then read by
the dual pipeline; the JSON is ``{strategy, chunks: [{position, paragraph_id, text, score}], answer?,
trace}`` with every stage's tokens and latency. ``--retriever`` and ``--route`` are MixPR options.

Prints ONE JSON object ``{route, chunks: [{position, text, score}], answer?, trace}`` with ``--json``
(``answer`` is left out with ``--retrieve-only``), else a short human-readable report. No Ray:
the pipeline runs in process with the configured LLM (bundled SmolLM2 through llama.cpp by
default). ``--retrieve-only`` with ``--route auto`` still loads the LLM for the router; give
``--route local|global`` to skip it. Exit status 2 on bad input (missing, empty or binary file).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from longrag.cli import number
from longrag.config import DUAL_STRATEGIES, load_config


class InputError(Exception):
    """A problem with what the user gave (file, options); reported without a traceback."""


def read_document(path: str, max_bytes: int | None = None) -> str:
    """The text of ``path`` (UTF-8), with clear errors for a missing, empty, binary or too large
    file. ``-`` reads standard input."""
    if path == "-":
        data = sys.stdin.buffer.read()
        where = "standard input"
    else:
        p = Path(path)
        if not p.exists():
            raise InputError(f"document file not found: {path}")
        if not p.is_file():
            raise InputError(f"document path is not a regular file: {path}")
        where = str(p)
        if max_bytes is not None and p.stat().st_size > max_bytes:
            raise InputError(f"{where} is {p.stat().st_size} bytes; the limit is {max_bytes} (mixpr.max_document_bytes)")
        data = p.read_bytes()
    if max_bytes is not None and len(data) > max_bytes:
        raise InputError(f"{where} is {len(data)} bytes; the limit is {max_bytes} (mixpr.max_document_bytes)")
    if b"\x00" in data[:65536]:
        raise InputError(f"{where} looks binary (it contains NUL bytes); give a UTF-8 text file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{where} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise InputError(f"{where} is empty (no non-whitespace text)")
    return text


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m jobs.longcontext", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--document", required=True, help="UTF-8 text file ('-' = standard input)")
    ap.add_argument("--question", default=None, help="the question; omitted: the document's last sentence is the query")
    ap.add_argument("--retriever", choices=["mixpr", "sparse", "hybrid"], default=None, help="default mixpr")
    ap.add_argument("--k", type=number(int, min_value=1), default=None, help="chunks to retrieve (default mixpr.top_k)")
    ap.add_argument("--route", choices=["auto", "local", "global"], default=None, help="default auto")
    ap.add_argument(
        "--strategy", choices=list(DUAL_STRATEGIES), default=None,
        help="run dual-perspective LongRAG with this strategy instead of MixPR",
    )  # fmt: skip
    ap.add_argument("--retrieve-only", action="store_true", help="stop after retrieval (no answer)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--config", default=None, help="LongRAGConfig YAML (sections llm, mixpr, embedding)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    ap.add_argument("--torch-threads", type=number(int, min_value=1), default=2, help="torch threads for --retriever hybrid")
    return ap


def _build_encoder(cfg: Any, threads: int):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from longrag.index.embedding import Embedder

    torch.set_num_threads(threads)
    return Embedder(cfg.embedding)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    try:
        cfg = load_config(args.config, args.overrides)
    except (ValueError, OSError) as e:
        raise InputError(f"bad configuration: {e}") from None
    if args.k is not None and args.k < 1:
        raise InputError(f"--k must be >= 1, got {args.k}")
    if args.strategy is not None:
        if args.retriever is not None or args.route is not None:
            raise InputError("--retriever and --route are MixPR options; --strategy runs the dual pipeline")
        return await _run_dual(args, cfg)
    args.retriever = args.retriever or "mixpr"
    args.route = args.route or "auto"
    document = read_document(args.document, cfg.mixpr.max_document_bytes)
    from longrag.reading.longcontext import LongContextPipeline  # after the input checks: they stay fast

    needs_llm = not args.retrieve_only or (args.retriever == "mixpr" and args.route == "auto")
    llm = None
    if needs_llm:
        from longrag.llm.factory import build_llm

        llm = build_llm(cfg.llm)
    encoder = _build_encoder(cfg, args.torch_threads) if args.retriever == "hybrid" else None
    try:
        pipe = LongContextPipeline(cfg.mixpr, llm=llm, encoder=encoder)
        result = await pipe.run(
            document, args.question, retriever=args.retriever, k=args.k, route=args.route, read=not args.retrieve_only
        )
    finally:
        if llm is not None:
            await llm.aclose()
    return result.to_dict()


async def _run_dual(args: argparse.Namespace, cfg: Any) -> dict[str, Any]:
    """``--strategy``: dual-perspective LongRAG over the document's paragraphs."""
    if not args.question or not args.question.strip():
        raise InputError("--strategy needs --question")
    document = read_document(args.document, cfg.mixpr.max_document_bytes)
    from longrag.dual.pipeline import DualPipeline
    from longrag.dual.rerank import load_reranker
    from longrag.dual.service import DualService

    try:
        scorer = load_reranker(cfg.dual.reranker) if cfg.dual.reranker else None
    except FileNotFoundError as e:
        raise InputError(str(e)) from None
    encoder = _build_encoder(cfg, args.torch_threads)
    llm = None
    if not args.retrieve_only:
        from longrag.llm.factory import build_llm

        llm = build_llm(cfg.llm)
    try:
        pipe = DualPipeline(llm, cfg.dual) if llm is not None else None
        service = DualService(pipe, encoder, scorer, cfg.dual)  # type: ignore[arg-type]
        res = await service.over_document(document, args.question, args.strategy, args.k, args.retrieve_only)
    finally:
        if llm is not None:
            await llm.aclose()
    return res.to_dict()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = asyncio.run(_run(args))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # the pipeline's own input checks
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
        return 0
    if "strategy" in out:
        print(f"strategy: {out['strategy']}  chunks: {len(out['chunks'])}  total_ms: {out['trace'].get('total_ms')}")
        for st in out["trace"].get("stages", []):
            print(f"  {st['stage']}: {st['calls']} calls, {st['prompt_tokens']} prompt + {st['completion_tokens']} "
                  f"completion tokens, {st['wall_ms']:.0f} ms")  # fmt: skip
        if "generator_input_tokens" in out["trace"]:
            print(f"  generator input tokens: {out['trace']['generator_input_tokens']}")
    else:
        print(f"route: {out['route']}  chunks: {len(out['chunks'])}  total_ms: {out['trace'].get('total_ms')}")
        for note in out["trace"].get("notes", []):
            print(f"note: {note}")
    if "answer" in out:
        print(f"answer: {out['answer']}")
    for c in out["chunks"][:20]:
        print(f"  [{c['position']}] ({c['score']:.4g}) {c['text'][:160]}")
    if len(out["chunks"]) > 20:
        print(f"  ... {len(out['chunks']) - 20} more (use --json for all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
