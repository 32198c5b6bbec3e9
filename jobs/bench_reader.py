"""Reader benchmark: full vs MixPR-compressed units at several context budgets, EM/F1 and seconds.

    python -m jobs.bench_reader --dataset hotpotqa --limit 30
    python -m jobs.bench_reader --dataset musique --limit 10 --settings full@2048/fs8,full@2048/fs2,full@2048,mixpr@2048

Retrieval runs in process (pooled paragraphs of the evaluated questions -> title-linked grouped units
-> MaxP over the bundled encoder); the candidates are a question's top units up to twice the largest
budget's tokens (``--candidate-tokens``); every setting then reads them with
the configured LLM (default: the bundled Qwen2.5-Coder-0.5B-Instruct through llama.cpp). Writes
``OUT/<dataset>.json``, ``OUT/<dataset>.md``, ``OUT/reader_bench.png`` and ends with a JSON line.
A rerun of the same command resumes from ``OUT/<dataset>.rows.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

from longrag.cli import job_setup, number
from longrag.config import load_config
from longrag.data import HOTPOTQA_SAMPLE, MUSIQUE_SAMPLE, data_path
from longrag.eval import reader_bench as rb
from longrag.eval.datasets import load_qa

ROOT = Path(__file__).resolve().parent.parent
DATASETS = {"hotpotqa": HOTPOTQA_SAMPLE, "musique": MUSIQUE_SAMPLE}
DEFAULT_SETTINGS = "full@2048/fs8,full@2048/fs2,full@2048,mixpr@2048,full@4096,mixpr@4096,full@8192,mixpr@8192"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.bench_reader", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=sorted(DATASETS), required=True)
    p.add_argument("--data", help="QA file (default: the sample under data/)")
    p.add_argument("--limit", type=number(int, min_value=1), default=30, help="questions (the first N of the file)")
    p.add_argument("--k", type=number(int, min_value=1), default=4, help="candidate units per question (at least)")
    p.add_argument("--candidate-tokens", type=number(int, min_value=0), help="take more units until they hold this many tokens "
                   "(default: twice the largest budget, so that every budget must choose)")
    p.add_argument("--settings", default=DEFAULT_SETTINGS, help="MODE@TOKENS[/fsN],... (MODE: full | mixpr)")
    p.add_argument("--out", default=str(ROOT / "reports" / "bench-reader"))
    p.add_argument("--config")
    p.add_argument("--set", action="append", default=[], help="config override section.field=value")
    args = p.parse_args(argv)
    try:
        args.settings = rb.parse_settings(args.settings)
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    job_setup()
    args = parse_args(argv)
    from longrag.llm.factory import build_llm

    config = load_config(args.config, args.set)
    top_budget = max(s.budget for s in args.settings)
    # the window must hold the largest budget plus both turns' prompts and answers
    config = config.with_overrides([f"llm.context_window={max(config.llm.context_window, top_budget + 2048)}"])
    out = Path(args.out)
    data = args.data or str(data_path(DATASETS[args.dataset]))
    loaded = load_qa(data, args.dataset)
    examples = loaded.examples[: args.limit]
    t0 = time.perf_counter()
    min_tokens = args.candidate_tokens if args.candidate_tokens is not None else 2 * top_budget
    cands = rb.retrieve_candidates(examples, args.k, min_tokens=min_tokens, embedding=config.embedding)
    logging.info("retrieval: %s", cands.stats)
    llm = build_llm(config.llm)
    rows = asyncio.run(rb.run_settings(llm, examples, cands, args.settings, base=config.reader, mixpr=config.mixpr,
                                       checkpoint=out / f"{args.dataset}.rows.jsonl"))
    summary = rb.summarize(rows)
    meta = {"llm": config.llm.model_dump(), "data": data, "malformed": loaded.n_malformed,
            "settings_spec": rb.setting_dicts(args.settings), "wall_s": round(time.perf_counter() - t0, 1),
            "command": ["python", "-m", "jobs.bench_reader", *(argv if argv is not None else sys.argv[1:])]}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.dataset}.json").write_text(json.dumps(rb.report_json(args.dataset, cands, summary, meta), indent=2))
    table = rb.markdown_table(args.dataset, summary)
    (out / f"{args.dataset}.md").write_text(table + "\n")
    summaries = {p.stem: json.loads(p.read_text())["settings"] for p in sorted(out.glob("*.json"))}
    rb.plot_summary(summaries, out / "reader_bench.png")
    print(table)
    print(json.dumps({"dataset": args.dataset, "settings": summary, "wall_s": meta["wall_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
