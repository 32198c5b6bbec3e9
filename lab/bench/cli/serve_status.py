"""``python -m jobs.bench serve-status``: what one ``serve.status()`` costs on a local Ray with the shard
tier's shape (issue 40, item 7): an application of ``--shards`` deployments x ``--replicas`` replicas
(0 CPUs each, a 1 ms search), the call timed ``--calls`` times idle and again while ``--clients``
concurrent callers keep every shard busy; p50/p95/max in ms, and the searches per second meanwhile.
A bounded run (``--timeout-s``); on a shared machine wrap it in ``flock /tmp/bench.lock``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time


def _percentiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50_ms": round(xs[len(xs) // 2], 2), "p95_ms": round(xs[int(len(xs) * 0.95)], 2),
            "max_ms": round(xs[-1], 2), "calls": len(xs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobs.bench serve-status", description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--timeout-s", type=float, default=400.0)
    args = p.parse_args(argv)

    import ray
    from ray import serve

    from serve.index_app import IndexBuild
    from serve.status import serve_status, wait_running

    class Shard:
        async def search(self) -> int:
            await asyncio.sleep(0.001)
            return 1

    t_start = time.monotonic()
    ray.init(include_dashboard=False, log_to_driver=False, num_cpus=2)
    try:
        serve.start(proxy_location="Disabled")
        shards = [serve.deployment(Shard).options(name=f"shard-{s}", num_replicas=args.replicas,
                                                  ray_actor_options={"num_cpus": 0}).bind()
                  for s in range(args.shards)]
        serve.run(IndexBuild.bind("bench", args.shards, *shards), name="index-bench", route_prefix=None,
                  blocking=False)
        reason = wait_running(["index-bench"], ready_timeout_s=args.timeout_s / 2, log=lambda *_: None)
        if reason:
            print(f"bench serve-status: FAILED: {reason}", file=sys.stderr)
            return 1
        started_s = time.monotonic() - t_start

        def timed(n: int) -> list[float]:
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                serve_status()
                out.append((time.perf_counter() - t0) * 1e3)
            return out

        timed(5)  # warm
        idle = timed(args.calls)
        stop, done = threading.Event(), [0]

        def load() -> None:
            handles = [serve.get_deployment_handle(f"shard-{s}", app_name="index-bench") for s in range(args.shards)]

            async def client(i: int) -> None:
                while not stop.is_set():
                    await handles[i % len(handles)].search.remote()
                    done[0] += 1

            async def clients() -> None:
                await asyncio.gather(*(client(i) for i in range(args.clients)))

            asyncio.run(clients())

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        time.sleep(3.0)
        n0, t0 = done[0], time.monotonic()
        loaded = timed(args.calls)
        rate = (done[0] - n0) / (time.monotonic() - t0)
        stop.set()
        loader.join(30)
        print(json.dumps({"shards": args.shards, "replicas": args.replicas, "clients": args.clients,
                          "startup_s": round(started_s, 1), "idle": _percentiles(idle),
                          "under_load": _percentiles(loaded), "searches_per_s_under_load": round(rate, 1)}))
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
