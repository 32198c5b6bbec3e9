"""Dual-perspective LongRAG in the LongBench setting: F1 per strategy (the paper's Table 3), generator input tokens
(its Figure 3) and the reranker's effect, on the bundled MuSiQue and HotpotQA samples.

    python -m jobs.eval_dual --limit 10 --out reports/dual
    python -m jobs.eval_dual --strategy R&B,E&F --datasets hotpotqa --limit 20 \\
        --set dual.reranker=artifacts/rerankers/minilm-reranker-v1 --reranked-strategy R&B

Each question's own paragraphs are its long context; it is chunked, retrieved densely with the bundled encoder
(and, with ``dual.reranker``, reranked for ``--reranked-strategy``) and answered by every strategy with the
configured LLM (default: the bundled Qwen reader). Questions: the held-out part of ``jobs.train_reranker``'s split
(``--questions first`` for the file's first ones). Writes ``OUT/dual_eval.json``, ``OUT/table3.md``,
``OUT/rows.jsonl`` and the plot (``--plot``, default ``OUT/dual_table3.png``); a rerun of the same command resumes
from ``OUT/.dual-checkpoint.jsonl``. See :mod:`lab.dual_bench`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from longrag.cli import number
from longrag.config import DUAL_STRATEGIES, load_config


def _csv(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.eval_dual", description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", "--strategies", dest="strategies", default=",".join(DUAL_STRATEGIES),
                   help=f"comma list of {', '.join(DUAL_STRATEGIES)}")  # fmt: skip
    p.add_argument("--datasets", default="musique,hotpotqa", help="comma list of musique, hotpotqa")
    p.add_argument("--limit", type=number(int, min_value=1), default=10, help="questions per dataset")
    p.add_argument("--start", type=number(int, min_value=0), default=0,
                   help="skip the first N selected questions (run the rest in another process)")
    p.add_argument("--questions", choices=["heldout", "first"], default="heldout",
                   help="heldout: questions jobs.train_reranker did not train on (its default split)")  # fmt: skip
    p.add_argument("--reranked-strategy", default="R&B",
                   help="strategies also answered over reranked chunks when dual.reranker is set ('' for none)")  # fmt: skip
    p.add_argument("--out", default="reports/dual")
    p.add_argument("--plot", default=None, help="PNG path (default OUT/dual_table3.png)")
    p.add_argument("--config", default=None, help="LongRAGConfig YAML (sections llm, dual, embedding)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--torch-threads", type=number(int, min_value=1), default=2)
    p.add_argument("--report-only", action="store_true",
                   help="write the report from the rows already in OUT's checkpoint (an unfinished run), answer nothing")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    from lab import dual_bench as db

    try:
        config = load_config(args.config, args.overrides)
        cfg = db.DualEvalConfig(
            datasets=_csv(args.datasets), strategies=_csv(args.strategies), limit=args.limit, start=args.start,
            questions=args.questions, reranked_strategies=_csv(args.reranked_strategy),
            dual=config.dual, llm=config.llm, embedding=config.embedding,
        )  # fmt: skip
        if not cfg.strategies:
            raise ValueError(f"no strategy given; valid: {', '.join(DUAL_STRATEGIES)}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        report = db.run_and_report(cfg, args.out, plot=args.plot, report_only=args.report_only,
                                   torch_threads=args.torch_threads,
                                   command=["python", "-m", "jobs.eval_dual", *(argv if argv is not None else sys.argv[1:])])
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report["markdown"])
    print(json.dumps({"summary": report["summary"], "retrieval_effect": report["retrieval_effect"],
                      "wall_s": report["wall_s"]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
