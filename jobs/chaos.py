"""``python -m jobs.chaos``: faults under load against the running Serve app, ending with one JSON line.

Starts a simulated two-node Ray on this machine (``cluster.local``), indexes the bundled enwiki sample
(or serves ``--index``) through a build alias, deploys ``serve/configs/cpu-cluster.yaml`` on
127.0.0.1 (2 replicas per shard, 2 Retrievers on different nodes, the small bundled reader ``--llm``;
everything else on the head node), then injects faults while it answers (:mod:`lab.chaos_scenarios`
has the scenarios, :mod:`lab.chaos` their records and verdicts, :mod:`serve.faults` the kills):

0. each question once before any fault: the top-k every later response must reproduce (exact search: the
   same units in the same order, those of a single in-process index over the build; degraded, the
   reference's units on the shards that answered);
1. ``replica``: ``--requests`` /v1/retrieve at ``--concurrency`` while one replica of a shard is killed, and
   on until it is re-created (the load spans the outage however fast the machine answers);
2. ``shard``: both replicas of the shard killed a quarter into ``--shard-requests`` requests;
3. ``llm``: the LLMServer replica killed while an answer is in flight, then while a streamed answer
   is under way; then one more answer;
4. ``rollout``: two updates of the build (``jobs.update``) published at once (exactly one may win),
   the app switches, the alias is rolled back within ``index.retire_after_s`` (:mod:`lab.chaos_rollout`);
5. ``node``: the worker node holding a Retriever replica killed (its shard replicas die with it), a
   new node joins ``node_down_s`` later; the app returns to full redundancy.

Bounded: the requests are counted, every wait has a deadline (``--recovery-timeout-s``, the app's
``serve.timeouts``). Exit 0 when every expectation held. Ray's and Serve's output goes to ``--log``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from lab.chaos import ChaosPlan, ScenarioResult, summarize
from lab.chaos_rollout import make_updates, single_index_references
from lab.chaos_scenarios import Faults, run_scenarios
from longrag.cli import job_setup
from longrag.data import SAMPLE_WIKI, data_path
from longrag.index.artifacts import ArtifactStore

ROOT = Path(__file__).resolve().parent.parent
APP = "longrag"
HEAD = "node:__internal_head__"  # the resource only Ray's head node has
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
        if dep["name"] == "Retriever":  # one per node: the node scenario kills the worker's
            dep.update(num_replicas=2, max_replicas_per_node=1)
        else:  # the rest on the head node, which no scenario kills
            options = dep.setdefault("ray_actor_options", {})
            options["resources"] = {**options.get("resources", {}), HEAD: 0.001}
    return config


def cluster_faults(handle: Any, index: str, num_cpus: float) -> Faults:
    """The kills and reads of the scenarios on this (simulated) cluster."""
    import ray

    from cluster import ray_private
    from serve.faults import kill_index_replicas, kill_serve_replica
    from serve.index_app import index_app_name
    from serve.status import running_replicas, serve_status

    build_id = ArtifactStore.open(index).read_manifest().build_id

    def replicas() -> list[dict[str, Any]]:
        apps = ray_private.serve_details().get("applications") or {}
        return [dict(r, deployment=d) for a in apps.values() for d, dep in a["deployments"].items()
                for r in dep["replicas"]]

    def kill_retriever_node() -> list[str]:
        """Kill (no graceful exit) the worker node of a running Retriever replica; every Serve replica on it."""
        head, now = ray.get_runtime_context().get_node_id(), replicas()
        on = [r["node_id"] for r in now if r["deployment"] == "Retriever" and r["state"] == "RUNNING"
              and r["node_id"] != head]
        if not on:
            raise RuntimeError("no Retriever replica runs on a worker node")
        node = next(n for n in handle.node_handles if n.node_id == on[0])
        dying = sorted(r["actor_name"] for r in now if r["node_id"] == on[0])
        handle.remove_node(node, graceful=False)
        return dying

    return Faults(kill_shard_replicas=lambda shard, n: kill_index_replicas(build_id, shard, n),
                  kill_llm=lambda: kill_serve_replica(APP, "LLMServer"),
                  apps=lambda: set(serve_status().applications), app_of=index_app_name,
                  kill_retriever_node=kill_retriever_node, add_node=lambda: handle.add_node(num_cpus=num_cpus),
                  retrievers=lambda: (running_replicas(APP).get("Retriever", 0), 2))  # 2: serve_config's


def run(args: argparse.Namespace) -> int:
    from ray import serve

    from cluster.local import start_or_join
    from longrag.index.alias import publish
    from serve.run import deploy, wait_healthy, wait_running

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
    handle = start_or_join(None, num_cpus=args.num_cpus, nodes=2)  # a head and a worker node, simulated
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
        single = single_index_references([index], plan)
        (top,) = single.values()  # each update removes a document of a question's top unit: its answer changes
        updates = make_updates(index, work, list(dict.fromkeys(units[0][0] for units in top.values()))[:2])
        single.update(single_index_references(updates, plan))
        builds = dict(zip(single, [index, *updates]))
        deploy(serve_config(alias, args.port, args.llm, args.read_timeout_s, plan))
        # a replica whose worker starts slowly on a loaded machine is reported "not scheduled": give it time
        reason = wait_running([APP], schedule_timeout_s=args.recovery_timeout_s,
                              ready_timeout_s=args.recovery_timeout_s * 5)
        if reason:
            raise RuntimeError(reason)
        base = f"http://127.0.0.1:{args.port}"
        with httpx.Client(base_url=base, timeout=30) as c:
            wait_healthy(c, args.recovery_timeout_s, status="ok")
        results = asyncio.run(run_scenarios(base, plan, cluster_faults(handle, index, args.num_cpus), alias, builds,
                                            single))
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
    p.add_argument("--num-cpus", type=float, default=4, help="logical CPUs of each (simulated) node")
    p.add_argument("--log", default=str(ROOT / "artifacts" / "chaos.log"), help="Ray's and Serve's output")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
