"""Reader benchmark: the reader against a bare prompt, full vs MixPR-compressed units, EM/F1 and seconds.

    python -m jobs.bench reader --dataset hotpotqa --limit 100
    python -m jobs.bench reader --dataset musique --limit 50 --settings plain@1024,mixpr@1024,mixpr@1024/2t
    python -m jobs.bench reader --dataset hotpotqa --set llm.model=qwen2.5-coder-1.5b-instruct

    python -m jobs.bench reader --dataset hotpotqa --limit 50 --document --settings plain,mixpr/auto,sparse/local/k400

``plain@B`` is the bare-prompt baseline; ``full@B``/``mixpr@B`` the LongReader with its direct short
answer, ``/2t`` with the paper's two turns (``/2t/fsN``: N worked examples in turn 2). The direct
answer never reads the long answer, so ``--set reader.long_answer=false`` gives the same answers in
half the time (the seconds are then the short answer's alone).

Retrieval runs in process (pooled paragraphs of the evaluated questions -> title-linked grouped units
-> MaxP over the bundled encoder); the candidates are a question's top units up to twice the largest
budget's tokens (``--candidate-tokens``); every setting then reads them with
the configured LLM (default: the bundled Qwen2.5-Coder-0.5B-Instruct through llama.cpp). Writes
``OUT/<dataset>.json``, ``OUT/<dataset>.md``, ``OUT/reader_bench.png`` and ends with a JSON line.
A rerun of the same command resumes from ``OUT/<dataset>.rows.jsonl``.

``--document``: the long-document reader instead (``lab.document_bench``): each question's
gold paragraphs and ``--distractors`` of its own distractors as one document, read by ``plain`` (the
same bare prompt over the whole document) and by ``jobs.longcontext``'s pipeline per setting
``RETRIEVER/ROUTE[/kN]``; files ``OUT/<dataset>-document.*``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

from lab import reader_bench as rb
from lab import reader_report as report
from longrag.cli import job_setup, number
from longrag.config import load_config
from longrag.data import HOTPOTQA_SAMPLE, MUSIQUE_SAMPLE, data_path
from longrag.eval.datasets import load_qa

ROOT = Path(__file__).resolve().parents[3]
DATASETS = {"hotpotqa": HOTPOTQA_SAMPLE, "musique": MUSIQUE_SAMPLE}
DEFAULT_SETTINGS = "plain@1024,full@1024,full@1024/2t,mixpr@1024"
DEFAULT_DOCUMENT_SETTINGS = "plain,mixpr/auto,sparse/local/k400"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.bench reader", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=sorted(DATASETS), required=True)
    p.add_argument("--data", help="QA file (default: the sample under data/)")
    p.add_argument("--limit", type=number(int, min_value=1), default=30, help="questions (the first N of the file)")
    p.add_argument("--k", type=number(int, min_value=1), default=4, help="candidate units per question (at least)")
    p.add_argument("--candidate-tokens", type=number(int, min_value=0), help="take more units until they hold this many tokens "
                   "(default: twice the largest budget, so that every budget must choose)")
    p.add_argument("--settings", help=f"MODE@TOKENS[/2t][/fsN],... (MODE: plain | full | mixpr; default {DEFAULT_SETTINGS});"
                   f" with --document: plain | RETRIEVER/ROUTE[/kN],... (default {DEFAULT_DOCUMENT_SETTINGS})")
    p.add_argument("--document", action="store_true", help="read one document per question (gold + distractor "
                   "paragraphs) with jobs.longcontext's pipeline beside the bare prompt")
    p.add_argument("--distractors", type=number(int, min_value=0), default=2, help="with --document: distractor paragraphs")
    p.add_argument("--out", default=str(ROOT / "reports" / "bench-reader"))
    p.add_argument("--config")
    p.add_argument("--set", action="append", default=[], help="config override section.field=value")
    args = p.parse_args(argv)
    try:
        if args.document:
            from lab.document_bench import parse_document_settings

            args.settings = parse_document_settings(args.settings or DEFAULT_DOCUMENT_SETTINGS)
        else:
            args.settings = rb.parse_settings(args.settings or DEFAULT_SETTINGS)
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    job_setup()
    args = parse_args(argv)
    from longrag.llm.factory import build_llm

    config = load_config(args.config, args.set)
    if args.document:
        return _document(args, config, argv)
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
    meta = {"llm": config.llm.model_dump(), "data": data, "malformed": loaded.n_malformed,
            "settings_spec": rb.setting_dicts(args.settings), "wall_s": round(time.perf_counter() - t0, 1),
            "command": ["python", "-m", "jobs.bench", "reader", *(argv if argv is not None else sys.argv[1:])]}
    table, summary = report.write_reports(out, args.dataset, rows, {"dataset": args.dataset, "retrieval": cands.stats,
                                                                **meta})
    summaries = {p.stem: json.loads(p.read_text())["settings"] for p in sorted(out.glob("*.json"))}
    report.plot_summary(summaries, out / "reader_bench.png")
    print(table)
    print(json.dumps({"dataset": args.dataset, "model": config.llm.model, "settings": summary,
                      "vs_plain": report.versus_plain(summary), "wall_s": meta["wall_s"]}))
    return 0


def _document(args: argparse.Namespace, config, argv: list[str] | None) -> int:
    from lab.document_bench import run_document_settings
    from longrag.llm.factory import build_llm

    out = Path(args.out)
    data = args.data or str(data_path(DATASETS[args.dataset]))
    loaded = load_qa(data, args.dataset)
    examples = [ex for ex in loaded.examples if any(p.is_supporting for p in ex.paragraphs)][: args.limit]
    t0 = time.perf_counter()
    llm = build_llm(config.llm)
    name = f"{args.dataset}-document"
    rows = asyncio.run(run_document_settings(llm, examples, args.settings, mixpr=config.mixpr,
                                             distractors=args.distractors, checkpoint=out / f"{name}.rows.jsonl"))
    wall_s = round(time.perf_counter() - t0, 1)
    table, summary = report.write_reports(out, name, rows, {
        "dataset": args.dataset, "document": {"distractors": args.distractors}, "llm": config.llm.model_dump(),
        "data": data, "malformed": loaded.n_malformed, "wall_s": wall_s,
        "command": ["python", "-m", "jobs.bench", "reader", *(argv if argv is not None else sys.argv[1:])]})
    print(table)
    print(json.dumps({"dataset": args.dataset, "document": True, "model": config.llm.model, "settings": summary,
                      "vs_plain": report.versus_plain(summary), "wall_s": wall_s}))
    return 0
