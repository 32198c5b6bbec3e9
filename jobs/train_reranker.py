"""Fine-tune the dual pipeline's reranker from the bundled MiniLM on CPU (a few minutes).

    python -m jobs.train_reranker --out artifacts/rerankers
    python -m jobs.train_reranker --out artifacts/rerankers --kind cross-encoder --max-steps 300

Trains on paragraph support labels of the bundled HotpotQA and MuSiQue samples (questions split into
train / held-out) with hard negatives (TF-IDF by default, or the dense encoder's): ``--kind bi-encoder`` (default) fine-tunes
the bundled sentence encoder, ``--kind cross-encoder`` a CrossEncoder from the same weights. Writes
``OUT/minilm-reranker-vN/`` (a sentence-transformers folder plus ``training_report.json``) and prints the
report as one JSON line: held-out recall@k of the supporting paragraphs in dense order (before) and
reranked (after). Use the folder with ``--set dual.reranker=OUT/minilm-reranker-vN``. See
:mod:`longrag.training.reranker`.
"""

from __future__ import annotations

import argparse
import json
import sys

from longrag.cli import job_setup
from longrag.training.reranker import DEFAULT_LR, KINDS, NEGATIVES, SOURCES, TrainerConfig, train_reranker


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    d = TrainerConfig()
    p = argparse.ArgumentParser(prog="python -m jobs.train_reranker", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="artifacts/rerankers", help="folder for versioned reranker folders")
    p.add_argument("--kind", choices=list(KINDS), default=d.kind, help="what to fine-tune (default %(default)s)")
    p.add_argument("--sources", default=",".join(d.sources), help=f"comma list of {sorted(SOURCES)}")
    p.add_argument("--limit-per-source", type=int, default=None, help="first N questions of each source")
    p.add_argument("--heldout-fraction", type=float, default=d.heldout_fraction)
    p.add_argument("--max-steps", type=int, default=d.max_steps, help="optimiser steps (bounds the time)")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--learning-rate", type=float, default=None,
                   help=f"of the encoder body (default {DEFAULT_LR})")
    p.add_argument("--negatives", choices=list(NEGATIVES), default=d.negatives,
                   help="hard negatives by TF-IDF (free) or the dense encoder, or random ones (default %(default)s)")
    p.add_argument("--head-learning-rate", type=float, default=d.head_learning_rate, help="of the new classifier head")
    p.add_argument("--negatives-per-positive", type=int, default=d.negatives_per_positive,
                   help="cross-encoder: negative paragraphs per supporting one (0: all)")
    p.add_argument("--max-length", type=int, default=d.max_length, help="tokens per (question, paragraph) pair")
    p.add_argument("--freeze-layers", type=int, default=d.freeze_layers,
                   help="freeze the embeddings and this many bottom layers (cheaper CPU steps; 0: train all)")
    p.add_argument("--eval-k", default=",".join(map(str, d.eval_k)), help="comma list of k for held-out recall@k")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--torch-threads", type=int, default=None)
    p.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    job_setup()
    try:
        cfg = TrainerConfig(
            kind=args.kind,
            negatives=args.negatives,
            sources=tuple(s.strip() for s in args.sources.split(",") if s.strip()),
            limit_per_source=args.limit_per_source,
            heldout_fraction=args.heldout_fraction,
            max_steps=args.max_steps,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            head_learning_rate=args.head_learning_rate,
            negatives_per_positive=args.negatives_per_positive or None,
            max_length=args.max_length,
            freeze_layers=args.freeze_layers,
            eval_k=tuple(int(k) for k in args.eval_k.split(",") if k.strip()),
            seed=args.seed,
            torch_threads=args.torch_threads,
        )
        cfg.check()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = train_reranker(args.out, cfg, progress_bar=not args.no_progress and sys.stderr.isatty())
    print(json.dumps(report.to_dict()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
