"""Evaluate retrieval (and the long reader) on a QA set: one command, offline, reproducible.

    python -m jobs.evaluate --dataset hotpotqa --data data/hotpotqa/hotpotqa_train100.json.gz \\
        --unit grouped,document,passage --links titles --k 1,2,4,8 --pipeline retrieve --out reports/hotpot

    python -m jobs.evaluate --dataset musique --data data/musique/musique_train100.json.gz \\
        --unit grouped --links titles --pipeline longrag --reader-k 4 --limit 20 --out reports/musique-qa

Steps: load the questions; pool the context paragraphs of every question of the set into one corpus
(or read ``--corpus``); add links (title mentions, TF-IDF neighbours, or the documents' own); build
the index -- or reuse a complete build whose fingerprint (corpus content, links and the
``BuildSettings``) matches; encode the questions; search the ``ShardedIndex`` actors (the service's
scatter/gather); run the ``LongReader`` over the top ``--reader-k`` units unless ``--pipeline
retrieve``; write ``metrics.json``, ``predictions.jsonl``, ``report.md`` and PNG plots. With
``--endpoint URL`` the questions go to a running Serve app instead (``/v1/retrieve``,
``/v1/answer``) and no index is built.

Several ``--unit`` (and ``--links``) values, comma-separated, run one setting each (written under
``OUT/<setting>/``) and a combined report in ``OUT`` (the unit-granularity comparison of LongRAG,
Jiang et al., 2024, Section 4.2, Tables 1-2, and Section 4.3, Figures 3-5). ``--combine RUN_DIR ...``
combines runs written earlier.

The command line fills in a typed :class:`longrag.eval.plan.EvalConfig`; the run is
:func:`longrag.eval.run.run_evaluation`, with the local Ray retrieval of :mod:`actors.evaluate` or
the HTTP one of :class:`longrag.eval.run.EndpointRetrieval`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from pydantic import ValidationError

from longrag.cli import add_cluster_flags, add_config_flags, choice_list, config_from_args, int_list, job_setup, number
from longrag.eval.plan import DATASET_FORMATS, LINK_SOURCES, UNIT_KINDS, EvalConfig, EvalRun

log = logging.getLogger("jobs.evaluate")


def _pool(value: str) -> str | int:
    if value in ("all", "selected"):
        return value
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise argparse.ArgumentTypeError(f"--pool takes all, selected or a positive integer, not {value!r}")


_ks = int_list(min_value=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=sorted(DATASET_FORMATS))
    p.add_argument("--data", help="QA file (JSON/JSONL) of the dataset")
    p.add_argument("--corpus", help="corpus file instead of the pooled paragraphs (corpus JSON/JSONL, DPR passages)")
    p.add_argument("--pool", type=_pool, default="all",
                   help="corpus = paragraphs of all questions of the file (default), of the evaluated "
                        "(--limit) ones only ('selected'), or of the first N questions (an integer)")
    p.add_argument("--unit", dest="units", type=choice_list(UNIT_KINDS, describe=", ".join(UNIT_KINDS)),
                   default=["grouped"], help="grouped|document|passage, comma-separated to compare several")
    p.add_argument("--links", type=choice_list(LINK_SOURCES, describe=", ".join(LINK_SOURCES)), default=["titles"],
                   help="hyperlinks|titles|tfidf|both (grouped units only), comma-separated to compare")
    p.add_argument("--k", dest="ks", type=lambda s: sorted(set(_ks(s))), default=[1, 2, 4, 8],
                   help="retrieval depths to score, comma-separated positive integers")
    p.add_argument("--pipeline", choices=["retrieve", "longrag", "dual"], default="retrieve",
                   help="dual: dual-perspective LongRAG in the LongBench setting (each question's own paragraphs; "
                        "lab.dual_bench, Table 3 layout); --dataset hotpotqa or musique")
    p.add_argument("--strategy", default="R&B,R&L,Ext,Fil,E&F", help="--pipeline dual: comma list of strategies")
    p.add_argument("--exclude-trained", metavar="LRG_DIR",
                   help="--pipeline dual: leave out the questions of this LRGinstruction build's train split")
    p.add_argument("--baseline", metavar="RUN_DIR",
                   help="--pipeline dual: an earlier run over the same questions (e.g. the base model); "
                        "writes OUT/comparison.md with F1 and filter precision/recall side by side")
    p.add_argument("--reader-k", type=number(int, min_value=1), default=4, help="units given to the reader")
    p.add_argument("--reader-concurrency", type=number(int, min_value=1), default=1,
                   help="reader calls in flight (remote LLMs)")
    p.add_argument("--limit", type=number(int, min_value=1), help="evaluate the first N questions")
    p.add_argument("--out", required=True, help="output directory for the report")
    p.add_argument("--index-dir", default="artifacts/eval-index", help="root of the index builds (local or s3://)")
    p.add_argument("--rebuild-index", action="store_true", help="rebuild even when a matching build exists")
    p.add_argument("--endpoint", help="running Serve app URL: retrieve/answer over HTTP instead of local actors")
    p.add_argument("--http-timeout", type=number(float, min_value=0, min_exclusive=True), default=300.0)
    p.add_argument("--encode", choices=["auto", "driver", "ray-data"], default="auto", help="query encoding")
    p.add_argument("--vector-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse chunk vectors encoded before with the same model and settings when the index is built "
                        "(embedding.vector_cache, keyed by each text's sha256; --no-vector-cache encodes everything)")
    p.add_argument("--answer-recall-all-types", action="store_true",
                   help="answer recall over all question types (default for HotpotQA: bridge only, as in LongRAG, "
                        "Jiang et al., 2024, Section 4.2)")
    add_config_flags(p)
    add_cluster_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--combine", nargs="+", metavar="RUN_DIR", help="combine earlier run directories into --out")
    p.add_argument("--compare", nargs="+", metavar="RUN_DIR",
                   help="earlier runs over the same questions, side by side: means and each run's paired "
                        "difference from the first with its 95%% bootstrap interval (longrag.eval.compare); "
                        "written to --out/comparison.md and .json")
    args = p.parse_args(argv)
    if not (args.combine or args.compare) and (not args.dataset or not args.data):
        p.error("--dataset and --data are required (unless --combine or --compare)")
    return args


def eval_config(args: argparse.Namespace) -> EvalConfig:
    """The typed evaluation config of the parsed command line."""
    return EvalConfig(
        dataset=args.dataset, data=args.data, corpus=args.corpus, pool=args.pool, units=args.units, links=args.links,
        ks=args.ks, pipeline=args.pipeline, reader_k=args.reader_k, reader_concurrency=args.reader_concurrency,
        limit=args.limit, out=args.out, index_dir=args.index_dir, rebuild_index=args.rebuild_index,
        endpoint=args.endpoint, http_timeout=args.http_timeout, encode=args.encode,
        answer_recall_all_types=args.answer_recall_all_types, progress=not args.no_progress,
    )


def _dual(args: argparse.Namespace, command: list[str]) -> int:
    """``--pipeline dual``: :func:`lab.dual_bench.run_and_report` on ``--data`` (default: the
    sample), ``--limit`` questions (default 10), every ``--strategy``."""
    from lab import dual_bench as db
    from lab.dual_report import load_report, write_comparison
    from longrag.lrg.records import trained_question_ids

    try:
        config = config_from_args(args)
        excluded = sorted(trained_question_ids(args.exclude_trained)) if args.exclude_trained else []
        cfg = db.DualEvalConfig(datasets=(args.dataset,), strategies=tuple(s.strip() for s in args.strategy.split(",")
                                                                          if s.strip()),
                                limit=args.limit or 10, dual=config.dual, llm=config.llm, embedding=config.embedding,
                                exclude_qids=tuple(excluded))
        baseline = load_report(args.baseline) if args.baseline else None
        report = db.run_and_report(cfg, args.out, command=command, data={args.dataset: args.data})
        if baseline is not None:
            md = write_comparison(baseline, report, args.out)
            report["markdown"] += "\n\n" + md
    except (ValidationError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report["markdown"])
    return 0


def _compare(run_dirs: list[str], out: str) -> int:
    from pathlib import Path

    from longrag.eval.compare import compare_runs, comparison_md

    try:
        cmp = compare_runs(run_dirs)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    md = comparison_md(cmp)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "comparison.md").write_text(md + "\n")
    (Path(out) / "comparison.json").write_text(json.dumps(cmp, indent=2) + "\n")
    print(md)
    return 0


def main(argv: list[str] | None = None) -> int:
    job_setup()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(raw)
    command = ["python", "-m", "jobs.evaluate", *raw]
    if args.combine:
        from longrag.eval.runs import combine

        print(json.dumps(combine(args.combine, args.out, command), indent=2))
        return 0
    if args.compare:
        return _compare(args.compare, args.out)
    if args.pipeline == "dual":
        return _dual(args, command)
    try:  # a bad --config/--set value is refused before anything starts
        config = config_from_args(args)
        config = config.model_copy(update={"embedding": config.embedding.model_copy(
            update={"vector_cache": args.vector_cache})})
        run = EvalRun(eval=eval_config(args), config=config, command=command)
    except (ValidationError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from longrag.eval.run import EndpointRetrieval, run_evaluation

    handle = None
    if run.eval.endpoint:
        retrieval = EndpointRetrieval(run.eval.endpoint, run.eval.http_timeout, run.eval.progress)
    else:
        from actors.evaluate import LocalRetrieval
        from cluster.local import start_or_join
        from serve.index_app import open_index

        retrieval = LocalRetrieval(open_index)
        handle = start_or_join(args.address, num_cpus=args.num_cpus)
    try:
        summary = run_evaluation(run, retrieval)
    except (ValueError, RuntimeError) as exc:
        log.error("evaluation failed: %s", exc)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if handle is not None and handle.started:
            handle.shutdown()
    print(json.dumps({k: summary[k] for k in ("out", "wall_s", "index_reused")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
