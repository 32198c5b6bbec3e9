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
from ``OUT/.dual-checkpoint.jsonl``. See :mod:`longrag.eval.dual_bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

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
    from longrag.eval import dual_bench as db

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
    import torch

    from longrag.dual.rerank import load_reranker
    from longrag.index.embedding import Embedder
    from longrag.llm.factory import build_llm

    torch.set_num_threads(args.torch_threads)
    try:
        scorer = load_reranker(cfg.dual.reranker) if cfg.dual.reranker else None
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    t0 = time.perf_counter()
    encoders: list[Embedder] = []

    def encoder() -> Embedder:  # built once, and only when needed
        if not encoders:
            encoders.append(Embedder(cfg.embedding))
        return encoders[0]

    if args.report_only:
        rows = db.checkpoint_rows(out / ".dual-checkpoint.jsonl")
        if not rows:
            print(f"error: no rows in {out / '.dual-checkpoint.jsonl'}", file=sys.stderr)
            return 2
    else:
        llm = build_llm(cfg.llm)
        try:
            rows = asyncio.run(db.run_dual_eval(cfg, llm, encoder(), scorer,
                                                checkpoint=out / ".dual-checkpoint.jsonl"))  # fmt: skip
        finally:
            asyncio.run(llm.aclose())
    summary = db.summarize(rows)
    effect = db.retrieval_effect(cfg, encoder(), scorer) if scorer is not None else []
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "config": cfg.model_dump(mode="json"),
        "summary": summary,
        "retrieval_effect": effect,
        "wall_s": round(time.perf_counter() - t0, 1),
        "command": ["python", "-m", "jobs.eval_dual", *(argv if argv is not None else sys.argv[1:])],
    }
    (out / "dual_eval.json").write_text(json.dumps(report, indent=2))
    with open(out / "rows.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    md = [db.table3_markdown(summary), "", db.tokens_markdown(summary)]
    if any(s["retrieval"] == db.RERANKED for s in summary):
        md += ["", db.reranker_markdown(summary)]
    if effect:
        md += ["", "| dataset | k | questions | support recall dense | reranked |", "| --- | --- | --- | --- | --- |"]
        md += [f"| {e['dataset']} | {e['k']} | {e['questions']} | {e['dense_recall']} | {e['reranked_recall']} |"
               for e in effect]  # fmt: skip
    (out / "table3.md").write_text("\n".join(md) + "\n")
    db.plot_table3(summary, args.plot or out / "dual_table3.png",
                   title=f"{cfg.llm.model}, dense only, {cfg.dual.chunk_words} words x k={cfg.dual.rerank_k}")  # fmt: skip
    print("\n".join(md))
    print(json.dumps({"summary": summary, "wall_s": report["wall_s"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
