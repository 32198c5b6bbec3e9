"""Build LRGinstruction, the fine-tuning data of dual-perspective LongRAG, as a Ray Data job.

    python -m jobs.lrg_instruct --data data/hotpotqa/hotpotqa_train100.json.gz data/musique/musique_train100.json.gz \\
        --teacher bundled --out artifacts/lrginstruction --limit 12
    python -m jobs.lrg_instruct --data train.json --teacher http://head:8000/v1 --model Qwen/Qwen2.5-7B-Instruct \\
        --out s3dir --concurrency 8 --qps 20

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Section 3.2 and Appendix C; the pipeline itself is
:mod:`longrag.lrg.build`. The teacher calls of each pass run on Ray Data:

- ``--engine ray-llm`` (the default for an endpoint teacher): ``ray.data.llm``'s HTTP request
  processor (``HttpRequestProcessorConfig`` + ``build_processor``) with ``--concurrency`` workers,
  ``--qps`` and ``--max-retries``. A block whose retries run out fails; the job tolerates failed blocks
  and reports each of their requests as an error.
- ``--engine actors`` (the only one for the bundled teacher): a ``map_batches`` pool of
  :class:`actors.teacher.TeacherActor` (``--concurrency`` actors, each holding the model or an HTTP
  client with the project's retrying OpenAI backend; ``--qps`` split between them).

Every reply is journaled in OUT as it arrives: rerunning the same command resumes. Writes
``OUT/train.jsonl``, ``OUT/heldout.jsonl`` (chat ``messages`` records), ``OUT/rejected.jsonl``,
``OUT/dataset_info.json`` (LLaMA-Factory) and ``OUT/report.json``, and prints the report's counts.
Runs as is under ``ray job submit -- python -m jobs.lrg_instruct ...`` (it joins ``RAY_ADDRESS``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from longrag.cli import add_cluster_flags, choice_list, number
from longrag.eval.datasets import load_qa
from longrag.llm.openai_http import estimate_tokens
from longrag.lrg.build import Input, build_lrg
from longrag.lrg.calls import Sink
from longrag.lrg.records import KINDS, LRGConfig, TeacherReply, TeacherRequest
from longrag.lrg.teacher import chat_payload, parse_teacher, reply_from_response

log = logging.getLogger("jobs.lrg_instruct")

ENGINES = ("auto", "actors", "ray-llm")


def ray_llm_available() -> bool:
    try:
        from ray.data.llm import HttpRequestProcessorConfig, build_processor  # noqa: F401
    except ImportError:
        return False
    return True


def _dataset(requests: Sequence[TeacherRequest], batch_size: int):
    import ray

    rows = [{"id": r.id, "prompt_sha": r.prompt_sha, "request": r.model_dump_json()} for r in requests]
    return ray.data.from_items(rows, override_num_blocks=max(1, min(len(rows) // batch_size, 200)))


def _tolerate_failed_blocks() -> None:
    """Let the job go on past a failed block: its requests are reported as errors by the caller."""
    from ray.data import DataContext

    DataContext.get_current().max_errored_blocks = -1


def _drain(ds, requests: Sequence[TeacherRequest], sink: Sink, what: str) -> None:
    """Stream the replies of ``ds`` into ``sink``; requests without a reply become error replies."""
    seen: set[str] = set()
    for row in ds.iter_rows():
        reply = TeacherReply.model_validate_json(row["reply"])
        seen.add(reply.id)
        sink(reply)
    for r in requests:
        if r.id not in seen:
            sink(TeacherReply(id=r.id, prompt_sha=r.prompt_sha, error=f"no reply: its {what} block failed"))


def actor_executor(llm: dict[str, Any], *, concurrency: int, in_flight: int, qps: float | None, batch_size: int,
                   num_cpus: float, temperature: float):  # fmt: skip
    from actors.teacher import TeacherActor

    def run(requests: Sequence[TeacherRequest], sink: Sink) -> None:
        from ray.data import ActorPoolStrategy

        _tolerate_failed_blocks()
        ds = _dataset(requests, batch_size).map_batches(
            TeacherActor,
            fn_constructor_kwargs={"llm_config": llm, "in_flight": in_flight,
                                   "qps": qps / concurrency if qps else None, "temperature": temperature},
            batch_size=batch_size,
            compute=ActorPoolStrategy(size=concurrency),
            num_cpus=num_cpus,
        )  # fmt: skip
        _drain(ds, requests, sink, "actor-pool")

    return run


def ray_llm_executor(llm: dict[str, Any], *, concurrency: int, qps: float | None, max_retries: int, batch_size: int,
                     temperature: float, api_key: str | None):  # fmt: skip
    from ray.data.llm import HttpRequestProcessorConfig, build_processor

    model, seed = llm["model"], llm.get("seed")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None

    def pre(row: dict) -> dict:
        req = TeacherRequest.model_validate_json(row["request"])
        return {"payload": chat_payload(req, model, temperature, seed)}

    def post(row: dict) -> dict:
        return {"reply": reply_from_response(row["id"], row["prompt_sha"], row["http_response"], model).model_dump_json()}

    def run(requests: Sequence[TeacherRequest], sink: Sink) -> None:
        _tolerate_failed_blocks()
        config = HttpRequestProcessorConfig(
            url=f"{llm['base_url']}/chat/completions",
            headers=headers,
            qps=int(qps) if qps else None,
            max_retries=max_retries,
            concurrency=concurrency,
            batch_size=batch_size,
        )
        processor = build_processor(config, preprocess=pre, postprocess=post)
        _drain(processor(_dataset(requests, batch_size)), requests, sink, "ray.data.llm")

    return run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    d = LRGConfig()
    p = argparse.ArgumentParser(prog="python -m jobs.lrg_instruct", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", required=True, metavar="QA_FILE",
                   help="QA files with support labels (HotpotQA, 2WikiMultihopQA or MuSiQue format)")
    p.add_argument("--teacher", required=True, help="bundled | bundled:NAME | http(s)://host:port/v1")
    p.add_argument("--model", default=None, help="the served model's name (endpoint teacher)")
    p.add_argument("--out", required=True, help="output folder (rerunning into it resumes)")
    p.add_argument("--limit", type=number(int, min_value=1), default=None,
                   help="use the first N kept questions of each file")
    p.add_argument("--kinds", type=choice_list(KINDS), default=list(KINDS), help=f"comma list of {', '.join(KINDS)}")
    p.add_argument("--distractors", choices=("balanced", "random"), default=d.distractors)
    p.add_argument("--heldout-fraction", type=number(float, min_value=0, max_value=0.99), default=d.heldout_fraction)
    p.add_argument("--min-output-tokens", type=number(int, min_value=0), default=d.min_output_tokens)
    p.add_argument("--generate-max-tokens", type=number(int, min_value=1), default=d.generate_max_tokens)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="auto: ray.data.llm for an endpoint teacher where it imports, else the actor pool")
    p.add_argument("--concurrency", type=number(int, min_value=1), default=None,
                   help="teacher actors / HTTP workers (default 1 bundled, 4 endpoint)")
    p.add_argument("--in-flight", type=number(int, min_value=1), default=4, help="calls in flight per actor")
    p.add_argument("--qps", type=number(float, min_value=0, min_exclusive=True), default=None,
                   help="teacher call starts per second over all workers")
    p.add_argument("--max-retries", type=number(int, min_value=0), default=3)
    p.add_argument("--batch-size", type=number(int, min_value=1), default=8, help="requests per Ray Data batch")
    p.add_argument("--actor-cpus", type=number(float, min_value=0), default=1.0, help="CPUs per teacher actor")
    p.add_argument("--context-window", type=number(int, min_value=512), default=8192, help="teacher window (tokens)")
    p.add_argument("--timeout-s", type=number(float, min_value=0, min_exclusive=True), default=300.0)
    add_cluster_flags(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        teacher = parse_teacher(args.teacher, args.model, context_window=args.context_window,
                                max_retries=args.max_retries, timeout_s=args.timeout_s, seed=args.seed)  # fmt: skip
        config = LRGConfig(kinds=tuple(args.kinds), distractors=args.distractors, heldout_fraction=args.heldout_fraction,
                           min_output_tokens=args.min_output_tokens, generate_max_tokens=args.generate_max_tokens,
                           seed=args.seed)  # fmt: skip
        engine = args.engine
        if engine == "auto":
            engine = "ray-llm" if teacher.backend == "openai" and ray_llm_available() else "actors"
        if engine == "ray-llm" and teacher.backend != "openai":
            raise ValueError("--engine ray-llm needs an endpoint teacher (http(s)://...); the bundled one uses actors")
        if engine == "ray-llm" and not ray_llm_available():
            raise ValueError("--engine ray-llm: ray.data.llm does not import here (pip install 'ray[llm]'); use actors")
        inputs = [Input(load_qa(path), args.limit) for path in args.data]
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    concurrency = args.concurrency or (1 if teacher.backend == "llamacpp" else 4)
    llm = teacher.model_dump()
    if engine == "ray-llm":
        import os

        executor = ray_llm_executor(llm, concurrency=concurrency, qps=args.qps, max_retries=args.max_retries,
                                    batch_size=args.batch_size, temperature=config.temperature,
                                    api_key=os.environ.get(teacher.api_key_env))  # fmt: skip
    else:
        executor = actor_executor(llm, concurrency=concurrency, in_flight=args.in_flight, qps=args.qps,
                                  batch_size=args.batch_size, num_cpus=args.actor_cpus,
                                  temperature=config.temperature)  # fmt: skip
    from cluster.local import start_or_join

    handle = start_or_join(args.address, num_cpus=args.num_cpus)
    try:
        report = build_lrg(inputs, args.out, config, executor, teacher=f"{teacher.model} ({teacher.backend})",
                           count_tokens=estimate_tokens)  # fmt: skip
    finally:
        if handle.started:
            handle.shutdown()
    summary = {
        "out": args.out,
        "engine": engine,
        "questions_kept": report.questions_kept,
        "records": report.records,
        "kept": {k: v.kept for k, v in report.kinds.items()},
        "kept_ratio": report.kept_ratio,
        "teacher_errors": report.teacher_errors,
        "teacher_replies_reused": report.teacher_replies_reused,
        "wall_s": report.wall_s,
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
