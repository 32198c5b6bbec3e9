"""Serving benchmark: the Serve app over HTTP beside the same work called in process.

    python -m jobs.bench serve --direct-ingress               # as make serve: retrieve at 1, 8, 32; chat at 1, 8
    python -m jobs.bench serve --skip-chat --requests 100     # retrieval only, through Serve's proxy

Deploys ``--config`` (default ``serve/configs/cpu.yaml``, what ``make serve`` runs) on a local Ray
(2 logical CPUs) over ``--index`` (default: the bundled sample, indexed first into
``artifacts/bench-serve``), on 127.0.0.1 only. Then, level by level: ``POST /v1/retrieve`` (in
``--mode``) at each ``--levels`` concurrency, beside the same work in this process (the query
encoder with one torch thread, ``InProcessIndex``) and beside Serve's floor (``serve/floor.py``),
with separate deployments also the Ingress' two deployment calls made through Serve handles;
``POST /v1/chat/completions`` at each ``--chat-levels``, beside ``LongReader`` over an in-process
llama.cpp (``--skip-chat`` leaves it out: ~10 s per answer on 2 cores); then ``--stream-requests``
streamed completions: time to the first token over HTTP vs in process. Per level: throughput,
p50/p99 latency, errors, the overhead of serving (served minus in process, and served / in
process), and for ``/v1/retrieve`` the medians of the app's own trace. The measuring is
:mod:`lab.bench`. Ray's and Serve's output goes to ``--log``; the terminal gets progress lines
and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any, TextIO

import httpx
import yaml

from lab.bench import machine, median_by_key, overhead, run_level, run_level_threads
from lab.bench.cli import running_app
from lab.bench.serving import (
    QUESTIONS,
    InProcessRetrieval,
    brief,
    chat_check,
    first_token_summary,
    http_first_token,
    reader_first_token,
    retrieve_check,
    summary,
)
from longrag.cli import int_list, job_setup, number, transcript
from longrag.config import LongRAGConfig
from longrag.index.graph import split_mode
from longrag.types import Retrieval

ROOT = Path(__file__).resolve().parents[3]
CPU_YAML = ROOT / "serve" / "configs" / "cpu.yaml"
APP = "longrag"

log = logging.getLogger("jobs.bench.serve")


def serve_config(index: str, port: int, one_replica: bool = False, path: Path = CPU_YAML,
                 admit: int | None = None) -> dict[str, Any]:
    """The Serve config at ``path`` with the benchmark's build and port; ``one_replica``: every
    autoscaled deployment held at one replica (what an autoscaling target is chosen from); ``admit``:
    ``serve.max_reader_requests`` raised to it (the chat levels measure the cost of serving, not
    admission, which ``jobs.bench traffic`` measures)."""
    config = yaml.safe_load(path.read_text())
    config["http_options"].update(host="127.0.0.1", port=port)
    (app,) = config["applications"]
    app["args"]["index"] = index
    if admit is not None:
        app["args"].setdefault("overrides", []).extend([f"serve.max_reader_requests={admit}",
                                                         "serve.max_reader_wait_s=null"])
    for dep in app["deployments"] if one_replica else []:
        if dep.pop("autoscaling_config", None) is not None:
            dep["num_replicas"] = 1
    return config


def app_config(index: str, config: dict[str, Any]) -> LongRAGConfig:
    """The config the app builds from (the build's own plus the YAML's overrides), as ``app_builder``."""
    from longrag.index.artifacts import ArtifactStore

    app = next(a for a in config["applications"] if a["name"] == APP)
    cfg = LongRAGConfig.model_validate(ArtifactStore.open(index).read_manifest().config)
    return cfg.with_overrides(app["args"].get("overrides", []))


async def bench_retrieve(client: httpx.AsyncClient, local: InProcessRetrieval, levels: list[int], requests: int,
                         k: int, say, floor: str = "/floor", mode: str = "dense") -> list[dict[str, Any]]:
    """``floor``: the floor app's URL prefix (its own port under direct ingress)."""
    async def call(i: int, prefix: str = "") -> tuple[httpx.Response, float]:
        t0 = time.perf_counter()
        body = {"question": QUESTIONS[i % len(QUESTIONS)], "k": k, **({"mode": mode} if prefix == "" else {})}
        r = await client.post(f"{prefix}/v1/retrieve", json=body)
        return r, (time.perf_counter() - t0) * 1e3

    def floor_check(res: tuple[httpx.Response, float]) -> str | None:
        return None if res[0].status_code == 200 else f"HTTP {res[0].status_code}"

    local_call = lambda i: local(QUESTIONS[i % len(QUESTIONS)], k, mode)  # noqa: E731

    def local_check(found: Retrieval) -> str | None:
        return None if len(found.units) == k else f"{len(found.units)} units (asked {k})"

    from ray import serve

    split = "QueryEncoder" in serve.status().applications[APP].deployments  # else serve.colocate
    encoder = serve.get_deployment_handle("QueryEncoder", app_name=APP) if split else None
    retriever = serve.get_deployment_handle("Retriever", app_name=APP) if split else None

    async def handles_call(i: int) -> Retrieval:
        # The Ingress' two calls from here: no HTTP, proxy or Ingress (the rest of the overhead)
        q = QUESTIONS[i % len(QUESTIONS)]
        hybrid, graph = split_mode(mode)
        return await retriever.retrieve.remote(await encoder.encode.remote(q), k, q if hybrid else None, graph)

    for i in range(len(QUESTIONS)):  # warm every path (model, tokenizer caches, connections, replicas)
        await call(i)
        await call(i, floor)
        if split:
            await handles_call(i)
        local_call(i)
    rows = []
    for c in levels:
        n = max(requests, c)
        traces: list[dict[str, float]] = []
        served = await run_level("retrieve.http", call, requests=n, concurrency=c, check=retrieve_check(k, traces))
        local_res = await asyncio.to_thread(run_level_threads, "retrieve.in_process", local_call, requests=n,
                                            concurrency=c, check=local_check)
        floor_res = await run_level("retrieve.serve_floor", lambda i: call(i, floor), requests=n, concurrency=c,
                                    check=floor_check)
        row = {"concurrency": c, "http": served.to_dict(), "in_process": local_res.to_dict(),
               "serve_floor": floor_res.to_dict(), "overhead": overhead(served, local_res).to_dict(),
               "trace_p50_ms": median_by_key(traces)}
        line = (f"retrieve c={c}: http {brief(served)} | in process {brief(local_res)} | "
                f"Serve's floor p50 {floor_res.latency.p50_ms} ms")
        if split:
            via_handles = await run_level("retrieve.handles", handles_call, requests=n, concurrency=c,
                                          check=local_check)
            row.update(handles=via_handles.to_dict(), overhead_handles=overhead(via_handles, local_res).to_dict())
            line += f" | handles {brief(via_handles)} (+{row['overhead_handles']['p50_ms']} ms p50)"
        say(f"{line} | overhead p50 +{row['overhead']['p50_ms']} ms (x{row['overhead']['p50_ratio']}), "
            f"throughput x{row['overhead']['throughput_ratio']} | trace p50 {row['trace_p50_ms']}")
        rows.append(row)
    return rows


async def bench_chat(client: httpx.AsyncClient, local: InProcessRetrieval, cfg: LongRAGConfig, levels: list[int],
                     requests: int, k: int, streams: int, say) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from functools import partial

    from longrag.llm.factory import build_llm
    from longrag.reading.longcontext import compress_units_with_mixpr
    from longrag.reading.reader import LongReader

    llm = build_llm(cfg.llm)  # the LLMServer's engine, here in process
    reader = LongReader(llm, cfg.reader, compressor=partial(compress_units_with_mixpr, cfg=cfg.mixpr))
    sizes = [max(requests, c) for c in levels]
    if sum(sizes) + streams + 1 > len(QUESTIONS):
        raise ValueError(f"chat levels {levels} with --chat-requests {requests} and --stream-requests {streams} need "
                         f"{sum(sizes) + streams + 1} questions; there are {len(QUESTIONS)}")
    units = {q: local(q, k).readable() for q in QUESTIONS}
    warm = QUESTIONS[-1]  # one question for warming both paths, asked by no level
    r = await client.post("/v1/chat/completions", json={"model": "longrag", "k": k,
                                                         "messages": [{"role": "user", "content": warm}]})
    if r.status_code != 200:
        raise RuntimeError(f"warm-up chat request failed: HTTP {r.status_code} {r.text[:300]}")
    await reader.read(warm, units[warm])
    rows = []
    start = 0
    try:
        for c, n in zip(levels, sizes):
            mine = QUESTIONS[start : start + n]
            start += n

            async def call(i: int, mine: list[str] = mine) -> httpx.Response:
                return await client.post("/v1/chat/completions", json={
                    "model": "longrag", "k": k, "messages": [{"role": "user", "content": mine[i]}]})

            async def read(i: int, mine: list[str] = mine) -> Any:
                return await reader.read(mine[i], units[mine[i]])

            served = await run_level("chat.http", call, requests=n, concurrency=c, check=chat_check)
            alone = await run_level("reader.in_process", read, requests=n, concurrency=c,
                                    check=lambda res: None if res.answer.strip() else "empty answer")
            row = {"concurrency": c, "http": served.to_dict(), "in_process": alone.to_dict(),
                   "overhead": overhead(served, alone).to_dict()}
            say(f"chat c={c}: http {brief(served)} | reader alone {brief(alone)} | "
                f"overhead p50 +{row['overhead']['p50_ms']} ms (x{row['overhead']['p50_ratio']})")
            rows.append(row)
        # streamed, one at a time: time to the first token over HTTP vs LongReader.read_stream here
        http_s = [await http_first_token(client, q, k) for q in QUESTIONS[start : start + streams]]
        local_s = [await reader_first_token(reader, q, units[q]) for q in QUESTIONS[start : start + streams]]
        stream = first_token_summary(http_s, local_s)
        say(f"stream c=1: first token http p50 {stream['http_first_token_p50_ms']} ms | in process "
            f"{stream['in_process_first_token_p50_ms']} ms | +{stream['first_token_overhead_p50_ms']} ms")
    finally:
        await llm.aclose()
    return rows, stream


async def _bench(args: argparse.Namespace, index: str, config: dict[str, Any], say) -> dict[str, Any]:
    cfg = app_config(index, config)
    local = InProcessRetrieval(index, cfg)
    limits = httpx.Limits(max_connections=max(args.levels + args.chat_levels) + 4)
    result: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{args.port}", timeout=600, limits=limits) as client:
        floor = f"http://127.0.0.1:{args.port + 1}/floor" if args.direct_ingress else "/floor"
        result["retrieve"] = await bench_retrieve(client, local, args.levels, args.requests, args.k, say, floor,
                                                  args.mode)
        if not args.skip_chat:
            result["chat"], result["stream"] = await bench_chat(
                client, local, cfg, args.chat_levels, args.chat_requests, args.chat_k, args.stream_requests, say)
    return result


def run(args: argparse.Namespace, terminal: TextIO) -> dict[str, Any]:
    def say(line: str) -> None:
        print(f"bench serve: {line}", file=terminal, flush=True)

    from actors.distbuild import ensure_sample_build

    t0 = time.perf_counter()
    before = machine()
    index = args.index or ensure_sample_build(str(ROOT / "artifacts" / "bench-serve"), say)
    config = serve_config(index, args.port, args.one_replica, Path(args.config), max(args.chat_levels))
    # Serve's own cost beside the app (serve/floor.py): the same request to an ingress doing nothing. With a
    # direct ingress the app's Ingress replica serves --port, the floor's (deployed after it) the next.
    floor = {"name": "floor", "route_prefix": "/floor", "import_path": "serve.floor:app"}
    with running_app(config, [APP], args.port, num_cpus=args.num_cpus, extra_apps=[floor], say=say,
                     direct_ingress=2 if args.direct_ingress else None):
        say(f"over {index} (load average {before['loadavg']})")
        result = asyncio.run(_bench(args, index, config, say))
    return {"bench": "serve", "config": args.config, "direct_ingress": args.direct_ingress, "mode": args.mode,
            "machine": {**before, "loadavg_after": machine()["loadavg"]}, "index": index, "k": args.k,
            "chat_k": args.chat_k, **result, "summary": summary(result), "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    job_setup(logging.WARNING)
    p = argparse.ArgumentParser(prog="python -m jobs.bench serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--index", help="build folder or URI (default: the bundled sample in artifacts/bench-serve)")
    p.add_argument("--config", default=str(CPU_YAML), help="Serve config YAML (default: serve/configs/cpu.yaml)")
    p.add_argument("--port", type=number(int, min_value=1, max_value=65535), default=8000)
    p.add_argument("--levels", type=int_list(), default=[1, 8, 32], help="retrieve concurrency levels")
    p.add_argument("--requests", type=number(int, min_value=1), default=200, help="retrieve requests per level (at least its concurrency)")
    p.add_argument("--k", type=number(int, min_value=1), default=4)
    p.add_argument("--mode", choices=["dense", "hybrid", "graph", "hybrid+graph"], default="dense",
                   help="retrieval mode (HTTP and in process)")
    p.add_argument("--chat-levels", type=int_list(), default=[1, 8])
    p.add_argument("--chat-requests", type=number(int, min_value=1), default=4, help="chat requests per level (at least its concurrency)")
    p.add_argument("--chat-k", type=number(int, min_value=1), default=2)
    p.add_argument("--stream-requests", type=number(int, min_value=0), default=3, help="streamed chat requests (first token)")
    p.add_argument("--skip-chat", action="store_true", help="leave out /v1/chat/completions (minutes)")
    p.add_argument("--direct-ingress", action="store_true", help="as `serve.run --direct-ingress` (make serve): the "
                   "Ingress replica serves --port itself, Serve's floor app the next port")
    p.add_argument("--one-replica", action="store_true", help="no replica autoscaling: one replica of each "
                   "deployment (requests per replica against latency, for the autoscaling targets)")
    p.add_argument("--num-cpus", type=number(float, min_value=0, min_exclusive=True), default=2,
                   help="logical CPUs of the local Ray (cpu.yaml fits 2)")
    p.add_argument("--out", default=str(ROOT / "reports" / "bench-serve"), help="folder for bench_serve.json")
    p.add_argument("--log", default=str(ROOT / "artifacts" / "bench-serve.log"), help="file for Ray's and Serve's output")
    args = p.parse_args(argv)
    with transcript(args.log) as terminal:
        try:
            report = run(args, terminal)
        except Exception as exc:
            log.exception("bench failed")
            print(f"bench serve: failed: {type(exc).__name__}: {exc} (log: {args.log})", file=terminal, flush=True)
            return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_serve.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report), flush=True)
    return 1 if report["summary"]["errors"] else 0
