"""``python -m jobs.chaos``: faults under load against the running Serve app, ending with one JSON line.

Starts a local Ray, indexes the bundled enwiki sample (or serves ``--index``), deploys
``serve/configs/cpu-cluster.yaml`` on 127.0.0.1 (2 replicas per shard, the small bundled reader
``--llm``; the shards as the build's Serve application), then kills parts of it from outside while it answers (:mod:`lab.chaos` has the scenarios and their
expectations, :mod:`serve.faults` the kills):

0. each question once before any fault: the top-k every later response must reproduce (exact search: the
   same units in the same order; degraded, the reference's units on the shards that answered);
1. ``replica``: ``--requests`` /v1/retrieve at ``--concurrency`` while one replica of a shard is killed, and
   on until it is re-created (the load spans the outage however fast the machine answers);
2. ``shard``: both replicas of the shard killed a quarter into ``--shard-requests`` requests;
3. ``llm``: the LLMServer replica killed while an answer is in flight, then while a streamed answer
   is under way; then one more answer;
4. ``rollout``: the app serves a build alias; two updates of the build (``jobs.update``) are published
   at once from it (exactly one may win), the app switches, the alias is rolled back within
   ``index.retire_after_s``; every answer is checked against a single in-process index over the
   build that answered it (:mod:`lab.chaos_rollout`).

Bounded: the requests are counted, every wait has a deadline (``--recovery-timeout-s``, the app's
``serve.timeouts``). Exit 0 when every expectation held. Ray's and Serve's output goes to ``--log``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from lab.chaos import (ChaosPlan, Outcome, ScenarioResult, LoadResult, References, judge_llm, judge_replica,
                       judge_rollout, judge_shard, reference_top_k, references_problem, retrieve_load, summarize,
                       wait_recovered)
from lab.chaos_rollout import make_updates, rollout, single_index_references
from longrag.cli import job_setup
from longrag.data import SAMPLE_WIKI, data_path
from longrag.index.artifacts import ArtifactStore

ROOT = Path(__file__).resolve().parent.parent
APP = "longrag"
log = logging.getLogger("jobs.chaos")


def serve_config(index: str, port: int, llm: str, read_timeout_s: float, plan: ChaosPlan) -> dict[str, Any]:
    """cpu-cluster.yaml on ``port`` over ``index`` (an alias, re-read every second): 2 replicas per shard,
    fixed replica counts; the Retriever's health check (which reads the shards' replica counts again)
    at Serve's default period, 10 s, the LLMServer's every 2 s (Serve replaces a killed replica sooner)."""
    config = yaml.safe_load((ROOT / "serve" / "configs" / "cpu-cluster.yaml").read_text())
    config["http_options"].update(host="127.0.0.1", port=port)
    (app,) = config["applications"]
    app["name"] = APP
    app["args"]["index"] = index
    app["args"]["overrides"] = ["index.replicas=2", "index.shard_num_cpus=0.1", f"llm.model={llm}",
                                f"serve.timeouts.read_s={read_timeout_s}", "index.refresh_s=1",
                                f"index.retire_after_s={plan.retire_after_s}"]
    for dep in app["deployments"]:
        if "autoscaling_config" in dep:
            dep.pop("autoscaling_config")
            dep["num_replicas"] = 1
        if dep["name"] in ("Retriever", "LLMServer"):
            dep.update(health_check_period_s=10 if dep["name"] == "Retriever" else 2, health_check_timeout_s=30)
    return config


async def replica_scenario(client: httpx.AsyncClient, plan: ChaosPlan, kill_replicas: Any, ref: References) -> ScenarioResult:
    killed: list[str] = []
    recovery: list[asyncio.Future] = []
    back = asyncio.Event()  # the load goes on until the replica is back (or recovery timed out)

    async def fault() -> None:
        t_kill = time.perf_counter()
        try:
            killed.extend(await asyncio.to_thread(kill_replicas, plan.shard, 1))
        except BaseException:
            back.set()
            raise
        recovery.append(asyncio.ensure_future(wait_recovered(client, plan, t_kill)))  # watched during the load
        recovery[-1].add_done_callback(lambda _: back.set())

    outcomes = await retrieve_load(client, plan, plan.requests, at=int(plan.requests * plan.kill_at), fault=fault,
                                   ref=ref, until=back)
    res = ScenarioResult(name="replica", killed=killed, load=LoadResult.of(outcomes), recovery=await recovery[0])
    return judge_replica(res, plan)


async def shard_scenario(client: httpx.AsyncClient, plan: ChaosPlan, kill_replicas: Any, ref: References) -> ScenarioResult:
    killed: list[str] = []
    recovery: list[asyncio.Future] = []

    async def fault() -> None:  # both replicas at once, while requests are in flight
        t_kill = time.perf_counter()
        killed.extend(await asyncio.to_thread(kill_replicas, plan.shard, 2))
        recovery.append(asyncio.ensure_future(wait_recovered(client, plan, t_kill)))

    outcomes = await retrieve_load(client, plan, plan.shard_requests, at=plan.shard_requests // 4, fault=fault,
                                   ref=ref)
    res = ScenarioResult(name="shard", killed=killed, load=LoadResult.of(outcomes), recovery=await recovery[0])
    return judge_shard(res, plan)


async def _sse(r: httpx.Response, first_token: asyncio.Event, events: list[tuple[str, Any]]) -> None:
    name = None
    async for line in r.aiter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name or "", json.loads(line[6:])))
            if name == "token":
                first_token.set()


async def llm_scenario(client: httpx.AsyncClient, plan: ChaosPlan) -> ScenarioResult:
    """Kill the LLMServer replica 1.5 s into a plain answer (after retrieval, while the reader reads),
    then at the first token of a streamed one; then ask once more."""
    from serve.faults import kill_serve_replica

    body = {"question": plan.answer_question, "k": 2}
    killed: list[str] = []
    t0 = time.perf_counter()
    answer = asyncio.ensure_future(client.post("/v1/answer", json=body))
    await asyncio.sleep(1.5)
    in_flight = not answer.done()
    killed.append(await asyncio.to_thread(kill_serve_replica, APP, "LLMServer"))
    try:
        r = await answer
        got = Outcome.of(r, (time.perf_counter() - t0) * 1e3)
    except httpx.HTTPError as exc:
        got = Outcome(status=0, ms=(time.perf_counter() - t0) * 1e3, error=f"{type(exc).__name__}: {exc}")

    events: list[tuple[str, Any]] = []
    first_token = asyncio.Event()
    async with client.stream("POST", "/v1/answer", json={**body, "stream": True}) as r:
        reader = asyncio.ensure_future(_sse(r, first_token, events))
        try:
            await asyncio.wait_for(first_token.wait(), plan.request_timeout_s)
            killed.append(await asyncio.to_thread(kill_serve_replica, APP, "LLMServer"))
        except asyncio.TimeoutError:
            pass
        await asyncio.wait_for(reader, plan.request_timeout_s * 5)
    error = next((d["error"] for n, d in events if n == "error"), None)

    t1 = time.perf_counter()
    try:
        nxt = Outcome.of(await client.post("/v1/answer", json=body), (time.perf_counter() - t1) * 1e3)
    except httpx.HTTPError as exc:
        nxt = Outcome(status=0, ms=(time.perf_counter() - t1) * 1e3, error=f"{type(exc).__name__}: {exc}")
    res = ScenarioResult(name="llm", killed=killed, answer=got, in_flight_at_kill=in_flight, next_request=nxt,
                         stream_events=[n for n, _ in events], stream_error=error)
    return judge_llm(res)


async def rollout_scenario(client: httpx.AsyncClient, plan: ChaosPlan, alias: str, parent: tuple[str, str],
                           updates: dict[str, str], ref: References) -> ScenarioResult:
    """:func:`lab.chaos_rollout.rollout` while requests go on (``plan.rollout_concurrency`` at a time)."""
    from serve.index_app import index_app_name
    from serve.status import serve_status

    done = asyncio.Event()
    timeline: list[asyncio.Future] = []

    async def fault() -> None:
        timeline.append(asyncio.ensure_future(rollout(
            client, plan, alias, parent, updates, ref, lambda: set(serve_status().applications), index_app_name)))
        timeline[-1].add_done_callback(lambda _: done.set())

    outcomes = await retrieve_load(client, plan.model_copy(update={"concurrency": plan.rollout_concurrency}), 20,
                                   at=5, fault=fault, ref=ref, until=done)
    res = ScenarioResult(name="rollout", killed=[], load=LoadResult.of(outcomes), rollout=await timeline[0])
    return judge_rollout(res)


def shard_killer(index: str) -> Any:
    """``kill(shard, n)``: kill n replicas of a shard deployment of the build's index application."""
    from serve.faults import kill_index_replicas

    build_id = ArtifactStore.open(index).read_manifest().build_id
    return lambda shard, n: kill_index_replicas(build_id, shard, n)


async def scenarios(base: str, plan: ChaosPlan, kill_replicas: Any, alias: str, builds: dict[str, str],
                    single: References) -> list[ScenarioResult]:
    """``builds``: build id -> uri, the served one first, then its updates; ``single``: their top-k from a
    single index (:func:`lab.chaos_rollout.single_index_references`)."""
    limits = httpx.Limits(max_connections=plan.concurrency + 2)
    async with httpx.AsyncClient(base_url=base, timeout=plan.request_timeout_s * 5, limits=limits) as client:
        app = await reference_top_k(client, plan)  # every later 200 is checked against it (exact search)
        if why := references_problem(app, single):
            raise RuntimeError(why)
        ref = {**single, **app}
        out = [await replica_scenario(client, plan, kill_replicas, ref)]
        log.warning("replica scenario: %s", out[-1].model_dump_json())
        out.append(await shard_scenario(client, plan, kill_replicas, ref))
        log.warning("shard scenario: %s", out[-1].model_dump_json())
        out.append(await llm_scenario(client, plan))
        log.warning("llm scenario: %s", out[-1].model_dump_json())
        (parent, *updates) = builds.items()
        out.append(await rollout_scenario(client, plan, alias, parent, dict(updates), ref))
        return out


def run(args: argparse.Namespace) -> int:
    from ray import serve

    from cluster.local import start_or_join
    from serve.run import deploy, wait_healthy, wait_running

    from longrag.index.alias import publish

    plan = ChaosPlan(requests=args.requests, concurrency=args.concurrency, shard_requests=args.shard_requests,
                     shard=args.shard, recovery_timeout_s=args.recovery_timeout_s, retire_after_s=args.retire_after_s)
    t0, load0 = time.perf_counter(), list(os.getloadavg())
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    logfile = open(args.log, "w", encoding="utf-8")  # Ray's and Serve's output: not the JSON line's stdout
    saved = os.dup(1), os.dup(2)
    os.dup2(logfile.fileno(), 1)
    os.dup2(logfile.fileno(), 2)
    results: list[ScenarioResult] = []
    error = None
    handle = start_or_join(None, num_cpus=args.num_cpus)
    try:
        index = args.index
        if index is None:
            from actors.distbuild import build_corpus_index
            from longrag.config import load_config

            index = str(Path(args.out).resolve())
            config = load_config(None, ["units.kind=grouped", "units.text_mode=lead", "index.shards=2"])
            build_corpus_index(str(data_path(SAMPLE_WIKI)), "wikixml", index, config, overwrite=True,
                               command=["python", "-m", "jobs.chaos"])
        work = Path(args.work).resolve()
        work.mkdir(parents=True, exist_ok=True)
        alias = str(work / "alias")  # the app serves the build through an alias, as updates are published
        publish(alias, index)
        (top,) = single_index_references([index], plan).values()  # each update changes a question's answer:
        firsts = list(dict.fromkeys(units[0][0] for units in top.values()))[:2]
        uris = [index, *make_updates(index, work, firsts)]
        single = single_index_references(uris, plan)
        builds = dict(zip(single, uris))
        deploy(serve_config(alias, args.port, args.llm, args.read_timeout_s, plan))
        # a replica whose worker starts slowly on a loaded machine is reported "not scheduled": give it time
        reason = wait_running([APP], schedule_timeout_s=args.recovery_timeout_s,
                              ready_timeout_s=args.recovery_timeout_s * 5)
        if reason:
            raise RuntimeError(reason)
        base = f"http://127.0.0.1:{args.port}"
        with httpx.Client(base_url=base, timeout=30) as c:
            wait_healthy(c, args.recovery_timeout_s, status="ok")
        results = asyncio.run(scenarios(base, plan, shard_killer(index), alias, builds, single))
    except Exception as exc:  # reported in the JSON line (and its traceback in the log)
        log.exception("chaos failed")
        error = f"{type(exc).__name__}: {exc}"[:1000]
    finally:
        try:
            serve.shutdown()
        finally:
            handle.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    summary = summarize(results, plan, time.perf_counter() - t0,
                        {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]},
                        error=error)
    print(summary.line(), flush=True)
    return 0 if summary.passed else 1


def main(argv: list[str] | None = None) -> int:
    job_setup(logging.WARNING)
    p = argparse.ArgumentParser(prog="python -m jobs.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--index", help="a build to serve (default: index the bundled sample into --out)")
    p.add_argument("--out", default=str(ROOT / "artifacts" / "chaos"), help="build folder when no --index")
    p.add_argument("--work", default=str(ROOT / "artifacts" / "chaos-work"), help="the alias and the updates")
    p.add_argument("--retire-after-s", type=float, default=20.0, help="index.retire_after_s of the app")
    p.add_argument("--requests", type=int, default=1000, help="/v1/retrieve requests of the replica scenario "
                   "(at least: the load goes on until the replica is back)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--shard-requests", type=int, default=100, help="requests of the shard scenario (both replicas "
                   "killed a quarter in)")
    p.add_argument("--shard", type=int, default=0, help="the shard whose replicas are killed")
    p.add_argument("--llm", default="smollm2-135m-instruct", help="the reader model (a small bundled one)")
    p.add_argument("--read-timeout-s", type=float, default=120.0, help="serve.timeouts.read_s of the app")
    p.add_argument("--recovery-timeout-s", type=float, default=120.0)
    p.add_argument("--port", type=int, default=8000, help="HTTP port on 127.0.0.1")
    p.add_argument("--num-cpus", type=float, default=4)
    p.add_argument("--log", default=str(ROOT / "artifacts" / "chaos.log"), help="Ray's and Serve's output")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
