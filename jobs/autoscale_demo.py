"""``python -m jobs.autoscale_demo``: the product's own work on an autoscaling cluster, end to end.

On the fake multinode cluster of :mod:`cluster.fake` (Ray's real autoscaler, the worker node types
of ``cluster/aws.yaml`` scaled down, a head with 0 CPUs), one second at a time on a timeline:

1. ``jobs.index`` on the bundled sample (embedding on the ``gpu_l4`` type, ``embedding.num_gpus=1``):
   the autoscaler launches nodes for the pending work; the build completes; the nodes go once idle;
2. the Serve app of ``serve/configs/cpu-cluster.yaml`` (shard deployments on ``index_cpu`` nodes;
   replica autoscaling with delays of seconds) until ``/readyz`` is ok;
3. a bounded burst of ``/v1/retrieve`` and ``/v1/answer`` on 127.0.0.1; a quarter in, the node
   holding the most shard replicas is killed (its raylet, as a lost machine);
4. after the burst: replicas back to their minimum and the nodes the burst added gone.

It writes the timeline as a PNG (``--png``) and ends with one JSON line of figures (:class:`lab.autoscale.
AutoscaleFigures`); exit 0 when every expectation held. Ray's output and the index job's log go to ``--log``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml

from cluster import ray_private
from lab.autoscale import AutoscaleFigures, BurstPlan, Sample, Timeline, burst, plot, scaled_down
from longrag.cli import job_setup, transcript
from longrag.data import SAMPLE_WIKI, data_path
from serve.run import readiness

ROOT = Path(__file__).resolve().parent.parent
APP = "longrag"
# replica autoscaling in seconds, not minutes (Ray's own autoscaling tests shorten the same fields)
FAST = {"upscale_delay_s": 2.0, "downscale_delay_s": 8.0, "look_back_period_s": 2.0, "metrics_interval_s": 0.5}


def scenario_config(index: str, port: int, llm: str, target: float) -> dict[str, Any]:
    """``cpu-cluster.yaml`` on 127.0.0.1:``port`` over ``index``: shard replicas ask for the index nodes'
    resource and a whole CPU, one replica of a shard per node (two per scaled ``index_cpu`` node, so
    four replicas take two nodes),
    the query encoder half a CPU (a second replica needs a second ``cpu`` node), autoscaling
    targets of ``target`` requests per replica with :data:`FAST` delays; one LLM call per answer
    (``reader.long_answer=false``: the one LLM replica on 2 cores is the burst's bottleneck)."""
    config = yaml.safe_load((ROOT / "serve" / "configs" / "cpu-cluster.yaml").read_text())
    config["http_options"].update(host="127.0.0.1", port=port)
    (app,) = config["applications"]
    app["name"] = APP
    app["args"]["index"] = index
    app["args"]["overrides"] = ["index.replicas=2", "index.shard_num_cpus=1", "index.node_resource=index",
                                "index.max_replicas_per_node=1", f"llm.model={llm}", "serve.timeouts.read_s=120",
                                "reader.long_answer=false", "serve.max_reader_requests=8",
                                "serve.max_reader_wait_s=null"]  # scaling is measured here, not admission
    for dep in app["deployments"]:
        if "autoscaling_config" in dep and not dep["name"].startswith("Dual"):
            dep["autoscaling_config"].update(FAST, target_ongoing_requests=target)
        if dep["name"] == "QueryEncoder":
            dep["ray_actor_options"]["num_cpus"] = 0.5
        if dep["name"] == "Retriever":  # its health check reads the shards' replica counts again
            dep.update(health_check_period_s=5, health_check_timeout_s=30)
    return config


def shard_nodes() -> list[str]:
    """The node id of every live shard replica (Serve's replica actors of the index applications)."""
    return [a["Address"]["NodeID"] for a in ray_private.actor_table()
            if re.match(r"ServeReplica:index-.+:shard-\d+$", a["ActorClassName"]) and a["State"] == "ALIVE"]


def health(client: httpx.Client) -> tuple[str, float]:
    """/readyz's status and the report's age (it is cached for serve.readyz_cache_s)."""
    try:
        r = client.get("/readyz", timeout=15)
        report = readiness(r)
        return report.get("status") or str(r.status_code), float(report.get("age_s", 0.0))
    except (httpx.HTTPError, ValueError, AttributeError):
        return "down", 0.0


class Sampler(threading.Thread):
    """Every second: worker nodes by type, running replicas (once deployed), /readyz, in flight."""

    def __init__(self, address: str, base: str, timeline: Timeline) -> None:
        super().__init__(daemon=True)
        self.address, self.timeline, self.deployed = address, timeline, False
        self.client, self.stop, self.health = httpx.Client(base_url=base), threading.Event(), []
        self.types: dict[str, str] = {}

    def last_health(self) -> str:
        """/readyz's status at the last sample (the sampler is its only caller: Ray 2.60's
        serve.status(), which /readyz calls, is not safe in two threads at once)."""
        return self.health[-1][1] if self.health else "not sampled"

    def run(self) -> None:
        from cluster.node_types import live_nodes
        from serve.run import running_replicas

        while not self.stop.wait(1.0):
            try:
                nodes = live_nodes(self.address)
                self.types.update(nodes)
                replicas = running_replicas(APP) if self.deployed else {}
                t = self.timeline.now()
                self.timeline.samples.append(Sample(t, dict(Counter(nodes.values())), replicas,
                                                    self.timeline.in_flight))
                if self.deployed:
                    status, age_s = health(self.client)
                    self.health.append((t - age_s, status))  # when the report was built
            except Exception as exc:  # a sample missed (the GCS busy): the next one counts
                print(f"sampler: {type(exc).__name__}: {exc}", file=sys.stderr)


def wait_for(pred, timeout_s: float, poll_s: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(poll_s)
    return False


def run(args: argparse.Namespace, out: Any) -> AutoscaleFigures:
    from ray import serve

    from cluster.fake import start_fake_cluster
    from longrag.index.artifacts import ArtifactStore
    from serve.run import deploy, wait_running

    fig = AutoscaleFigures(passed=False, wall_s=0.0, load_avg={"start": [round(x, 2) for x in os.getloadavg()]})
    tl = Timeline()
    base = f"http://127.0.0.1:{args.port}"
    fake = start_fake_cluster(max_workers={"cpu": 3, "index_cpu": 3, "gpu_l4": 2},
                              idle_timeout_minutes=args.idle_timeout_min)
    sampler = Sampler(fake.address, base, tl)
    sampler.start()
    try:
        # 1. the index job, submitted to the cluster as a user runs it
        t_index = tl.mark("index")
        cmd = [sys.executable, "-m", "jobs.index", "--address", fake.address, "--source", str(data_path(SAMPLE_WIKI)),
               "--format", "wikixml", "--out", args.out, "--unit", "grouped", "--text-mode", "lead", "--shards", "2",
               "--overwrite", "--set", "embedding.num_gpus=1"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout_s)
        print(proc.stderr[-20000:], file=sys.stderr)
        t_done = tl.mark("index done")
        fig.index_s = round(t_done - t_index, 1)
        pool = re.search(r"embedding pool: .*", proc.stderr)
        fig.embedding_pool = pool.group(0) if pool else None
        fig.manifest_complete = proc.returncode == 0 and ArtifactStore.open(args.out).status() == "complete"
        first = tl.first(t_index, lambda s: sum(s.nodes.values()) > 0)
        fig.index_first_node_s = round(first - t_index, 1) if first is not None else None
        fig.index_nodes = tl.peak_nodes(t_index, t_done)
        if not fig.manifest_complete:
            raise RuntimeError(f"the index job failed ({proc.returncode}): {proc.stderr[-2000:]}")
        if wait_for(lambda: bool(tl.samples) and tl.samples[-1].t > t_done and not tl.samples[-1].nodes,
                    args.settle_timeout_s):
            fig.index_scale_down_s = round(tl.samples[-1].t - t_done, 1)

        # 2. the Serve app
        t_deploy = tl.mark("deploy")
        deploy(scenario_config(str(Path(args.out).resolve()), args.port, args.llm, args.target))
        sampler.deployed = True
        reason = wait_running([APP], schedule_timeout_s=args.settle_timeout_s, ready_timeout_s=args.timeout_s)
        if reason:
            raise RuntimeError(reason)
        if not wait_for(lambda: sampler.last_health() == "ok", args.settle_timeout_s):
            raise RuntimeError(f"/readyz not ok in {args.settle_timeout_s:g} s: {sampler.last_health()}")
        fig.time_to_healthy_s = round(tl.mark("healthy") - t_deploy, 1)
        first = tl.first(t_deploy, lambda s: sum(s.nodes.values()) > 0)
        fig.serve_first_node_s = round(first - t_deploy, 1) if first is not None else None
        fig.shard_node_types = sorted(sampler.types.get(n, "?") for n in shard_nodes())
        time.sleep(3)
        before = copy.deepcopy(tl.samples[-1])

        # 3. the burst, a worker node killed a quarter in
        def kill() -> None:
            held = Counter(shard_nodes()).most_common(1)
            if not held:
                fig.problems.append("no live shard replica to kill a node under")
                return
            victim = held[0][0]
            fig.killed_node_type = sampler.types.get(victim)
            fake.kill_node(victim)
            tl.mark("node killed")

        plan = BurstPlan(requests=args.requests, concurrency=args.concurrency, max_s=args.burst_s,
                         answer_every=args.answer_every)
        t_burst = tl.mark("burst")
        outcomes = asyncio.run(burst(base, plan, tl, at=(args.requests // 4, kill) if args.kill else None))
        t_end = tl.mark("burst over")
        fig.requests = len(outcomes)
        fig.requests_failed = sum(o.status != 200 for o in outcomes)
        fig.server_errors = sum(o.status >= 500 or o.status == 0 for o in outcomes)
        fig.degraded = sum(o.degraded for o in outcomes)
        errors = sorted({o.error for o in outcomes if o.error})[:5]
        if errors:
            fig.problems.append(f"errors: {errors}")

        # 4. scale-down: replicas at their minimum, no more nodes than before the burst (but those holding shards)
        def settled() -> bool:
            holding = Counter(sampler.types.get(n) for n in set(shard_nodes()))
            return tl.samples[-1].t > t_end and scaled_down(tl.samples[-1], before, args.scaled, holding)

        if wait_for(settled, args.settle_timeout_s):
            fig.time_to_scale_down_s = round(tl.samples[-1].t - t_end, 1)
            tl.mark("scaled down")
        t_kill, kt = tl.event("node killed"), fig.killed_node_type or ""
        if t_kill is not None:
            lost = tl.first(t_kill, lambda s: s.nodes.get(kt, 0) < before.nodes.get(kt, 0))
            new = tl.first(lost, lambda s: s.nodes.get(kt, 0) >= before.nodes.get(kt, 0)) if lost else None
            fig.kill_to_node_lost_s = round(lost - t_kill, 1) if lost is not None else None
            fig.kill_to_new_node_s = round(new - t_kill, 1) if new is not None else None
            down = next((t for t, h in sampler.health if t >= t_kill and h != "ok"), t_kill + 10.0)  # Serve lags
            back = next((t for t, h in sampler.health if t > down and h == "ok"), None)
            fig.kill_to_full_coverage_s = round(back - t_kill, 1) if back is not None else None
        wait_for(lambda: sampler.last_health() == "ok", args.settle_timeout_s)  # Serve's DOWNSCALING status passes
        fig.replicas = tl.replica_range(t_burst)
        fig.healthy_at_end = sampler.last_health() == "ok"
        fig.replicas_at_end = dict(tl.samples[-1].replicas)
        fig.nodes_at_end = dict(tl.samples[-1].nodes)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        fig.error = f"{type(exc).__name__}: {exc}"[:1000]
    finally:
        sampler.stop.set()
        sampler.join(timeout=10)
        try:
            serve.shutdown()
        finally:
            fake.shutdown()
    fig.wall_s = round(tl.now(), 1)
    fig.load_avg["end"] = [round(x, 2) for x in os.getloadavg()]
    judge(fig, args)
    plot(tl, args.png, title=f"jobs.autoscale_demo: fake multinode cluster of cluster/aws.yaml's node types "
                             f"(load avg {fig.load_avg['start'][0]:.1f} at start)")
    return fig


def judge(fig: AutoscaleFigures, args: argparse.Namespace) -> None:
    p = fig.problems
    if fig.error:
        p.append(fig.error)
    if not (fig.manifest_complete and fig.index_first_node_s is not None):
        p.append("the index job did not complete on nodes the autoscaler launched")
    if fig.index_scale_down_s is None:
        p.append("the index job's nodes were not removed once idle")
    if not fig.shard_node_types or set(fig.shard_node_types) != {"index_cpu"}:
        p.append(f"shard replicas not all on index_cpu nodes: {fig.shard_node_types}")
    if fig.server_errors or fig.requests_failed:
        p.append(f"{fig.requests_failed} requests failed, {fig.server_errors} with a 5xx or no response")
    if not any(fig.replicas.get(d, [0, 0])[1] > 1 for d in args.scaled):
        p.append(f"no deployment of {args.scaled} grew under the burst: {fig.replicas}")
    if fig.time_to_scale_down_s is None:
        p.append(f"not scaled down after the burst: replicas {fig.replicas_at_end}, nodes {fig.nodes_at_end}")
    if args.kill and fig.kill_to_full_coverage_s is None:
        p.append("full coverage not back after the node was killed")
    if not fig.healthy_at_end:
        p.append("/readyz not ok at the end")
    fig.passed = not p


def main(argv: list[str] | None = None) -> int:
    job_setup()
    p = argparse.ArgumentParser(prog="python -m jobs.autoscale_demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "artifacts" / "autoscale"), help="the index build folder")
    p.add_argument("--png", default=str(ROOT / "docs" / "autoscale_timeline.png"))
    p.add_argument("--log", default=str(ROOT / "artifacts" / "autoscale.log"), help="Ray's output, the index job's log")
    p.add_argument("--requests", type=int, default=600, help="requests of the burst (at most)")
    p.add_argument("--burst-s", type=float, default=150.0, help="the burst's time limit")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--answer-every", type=int, default=40, help="every n-th request is an /v1/answer (k=1)")
    p.add_argument("--target", type=float, default=1.0, help="target_ongoing_requests of the autoscaled deployments")
    p.add_argument("--scaled", nargs="+", default=["QueryEncoder", "Retriever", "Reader"],
                   help="deployments expected to grow under the burst and shrink after it")
    p.add_argument("--no-kill", dest="kill", action="store_false", help="no node killed under load")
    p.add_argument("--llm", default="smollm2-135m-instruct", help="the reader model (a small bundled one)")
    p.add_argument("--idle-timeout-min", type=float, default=0.1, help="the autoscaler's idle_timeout_minutes")
    p.add_argument("--settle-timeout-s", type=float, default=240.0, help="longest wait for nodes/health/scale-down")
    p.add_argument("--timeout-s", type=float, default=900.0, help="longest index job / deploy")
    p.add_argument("--port", type=int, default=8420, help="HTTP port on 127.0.0.1")
    args = p.parse_args(argv)
    with transcript(args.log) as out:
        fig = run(args, out)
        print(fig.line(), file=out, flush=True)
    return 0 if fig.passed else 1


if __name__ == "__main__":
    sys.exit(main())
