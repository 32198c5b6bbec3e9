"""Traffic benchmark: the app's answers under load, with clients that give up (issue 44).

    python -m jobs.bench traffic                                  # make serve's app over the bundled sample
    python -m jobs.bench traffic --levels 0.5,1,2,4 --duration-s 60 --plot docs/traffic.png

Deploys ``--config`` (default ``serve/configs/cpu.yaml``, what ``make serve`` runs) on a local Ray
over the bundled sample (indexed first into ``artifacts/bench-serve``), 127.0.0.1 only, then runs
:mod:`lab.bench.traffic`: the abandoned burst (8 clients give up after 1.5 s, then one more
question), 24 clients at once, the reader's capacity (answers/s, one client over the questions),
and open-loop Poisson arrivals at each ``--levels`` multiple of it, 30% of the clients giving up
uniformly in 0.5-5 s, the rest at 60 s. Per phase: the LLMServer's generated and cancelled tokens
(its own counters, where it has them) and the peak memory of Ray's processes. Progress lines go to
the terminal, Ray's output to ``--log``, and last one JSON line (``--out`` keeps it, ``--plot`` draws
goodput and p99 against offered load).
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

from lab.bench import machine
from lab.bench.cli import running_app
from lab.bench.serving import QUESTIONS
from lab.bench.traffic import Arrivals, abandoned_burst, capacity, crowd, open_loop
from longrag.cli import job_setup, number, transcript
from longrag.memory import MemorySampler

ROOT = Path(__file__).resolve().parents[3]
APP = "longrag"


def float_list(text: str) -> list[float]:
    values = [float(x) for x in text.split(",") if x.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"a comma-separated list of positive numbers, got {text!r}")
    return values


async def llm_counters() -> dict[str, Any]:
    """The LLMServer's description (cancelled calls, the engine's token counts)."""
    from ray import serve

    return (await serve.get_deployment_handle("LLMServer", app_name=APP).describe.remote()).model_dump()


def token_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    b, a = before.get("engine_cancelled") or {}, after.get("engine_cancelled") or {}
    if "all_generated_tokens" not in a:
        return {"counted": False}
    total = a["all_generated_tokens"] - b.get("all_generated_tokens", 0)
    wasted = a["generated_tokens"] - b.get("generated_tokens", 0)
    return {"counted": True, "generated_tokens": total, "cancelled_tokens": wasted,
            "cancelled_share": round(wasted / total, 4) if total else 0.0,
            "cancelled_calls": a["requests"] - b.get("requests", 0)}


async def _phases(args: argparse.Namespace, say, memory: MemorySampler) -> dict[str, Any]:
    qs = QUESTIONS
    out: dict[str, Any] = {}

    async def phase(name: str, coro: Any) -> dict[str, Any]:
        before = await llm_counters()
        res = await coro
        res.update(llm=token_delta(before, await llm_counters()), peak_gib=round(memory.new_phase() / 2**30, 3))
        out[name] = res
        await asyncio.sleep(args.rest_s)
        return res

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)  # a client that gives up closes
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{args.port}", timeout=None, limits=limits) as client:
        memory.new_phase()
        burst = await phase("abandoned_burst", abandoned_burst(client, qs[:3], qs[3:11], qs[11]))
        say(f"abandoned burst: next question {burst['next_s']} s = {burst['next_over_unloaded']}x unloaded "
            f"p50 {burst['unloaded_p50_s']} s (burst: {burst['burst_statuses']})")
        many = await phase("crowd", crowd(client, [qs[i % len(qs)] for i in range(args.crowd)]))
        say(f"{args.crowd} at once: {many['answered']} answered, {many['shed']} shed, longest wait {many['max_wait_s']} s")
        cap = await phase("capacity", capacity(client, qs))
        say(f"capacity: {cap['answers_per_s']} answers/s one at a time over {cap['questions']} questions")
        out["levels"] = []
        for i, x in enumerate(args.levels):
            arrivals = Arrivals(rate=x * cap["answers_per_s"], duration_s=args.duration_s, seed=args.seed + i)
            level = await phase("level", open_loop(client, qs, arrivals))
            level["load"] = x
            if not args.keep_outcomes:
                level.pop("outcomes")
            out["levels"].append(out.pop("level"))
            say(f"{x}x capacity ({level['offered']} offered): goodput {level['goodput_rps']}/s, p99 {level['p99_s']} s, "
                f"503 {level['shed_503']}, gave up {level['gave_up']}, other 5xx {level['other_5xx']}, "
                f"cancelled tokens {level['llm'].get('cancelled_share')}")
    return out


def plot(results: list[dict[str, Any]], path: str) -> None:
    """Goodput (x each run's own capacity) and p99 of delivered answers against offered load, one
    line per run (its label), the 3x-unloaded-p50 bound of the last run dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9.5, 3.8))
    for result in results:
        levels, label = result["levels"], result.get("label") or "run"
        x = [lv["load"] for lv in levels]
        a.plot(x, [lv["goodput_rps"] / result["capacity"]["answers_per_s"] for lv in levels], "o-", label=label)
        b.plot(x, [lv["p99_s"] for lv in levels], "o-", label=label)
    b.axhline(3 * results[-1]["abandoned_burst"]["unloaded_p50_s"], ls=":", color="gray", label="3x unloaded p50")
    a.set(xlabel="offered load (x capacity)", ylabel="goodput (x capacity)", title="answers delivered in time")
    b.set(xlabel="offered load (x capacity)", ylabel="p99 of delivered answers (s)", title="latency of those")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace, terminal: TextIO) -> dict[str, Any]:
    def say(line: str) -> None:
        print(f"bench traffic: {line}", file=terminal, flush=True)

    from actors.distbuild import ensure_sample_build

    t0 = time.perf_counter()
    before = machine()
    index = args.index or ensure_sample_build(str(ROOT / "artifacts" / "bench-serve"), say)
    config = yaml.safe_load(Path(args.config).read_text())
    config["http_options"].update(host="127.0.0.1", port=args.port)
    config["applications"][0]["args"]["index"] = index
    config["applications"][0]["args"].setdefault("overrides", []).extend(args.set)
    with running_app(config, [APP], args.port, direct_ingress=1, say=say):
        say(f"over {index} (load average {before['loadavg']})")
        with MemorySampler(children=True) as memory:  # this process and the local Ray it started
            result = asyncio.run(_phases(args, say, memory))
    return {"bench": "traffic", "label": args.label, "config": args.config, "overrides": args.set,
            "machine": {**before, "loadavg_after": machine()["loadavg"]}, **result,
            "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    job_setup(logging.WARNING)
    p = argparse.ArgumentParser(prog="python -m jobs.bench traffic", description=__doc__.split("\n\n")[0])
    p.add_argument("--index", help="build folder or URI (default: the bundled sample in artifacts/bench-serve)")
    p.add_argument("--config", default=str(ROOT / "serve" / "configs" / "cpu.yaml"), help="Serve config YAML")
    p.add_argument("--set", action="append", default=[], help="a config override for the app (section.field=value)")
    p.add_argument("--port", type=number(int, min_value=1, max_value=65535), default=8000)
    p.add_argument("--levels", type=float_list, default=[0.5, 1, 2, 4], help="offered loads, x the reader's capacity")
    p.add_argument("--duration-s", type=number(float, min_value=1), default=60.0, help="seconds of arrivals per level")
    p.add_argument("--crowd", type=number(int, min_value=1), default=24, help="clients of the all-at-once phase")
    p.add_argument("--rest-s", type=number(float, min_value=0), default=5.0, help="quiet seconds between phases")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="", help="what this run is (in the JSON and the plot's title)")
    p.add_argument("--keep-outcomes", action="store_true", help="every request's outcome in the JSON")
    p.add_argument("--out", help="write the JSON here too")
    p.add_argument("--plot", help="draw goodput and p99 against offered load to this PNG")
    p.add_argument("--compare", action="append", default=[], help="the JSON of an earlier run (--out) to plot "
                   "beside this one (repeatable)")
    p.add_argument("--log", default="artifacts/bench_traffic.log", help="Ray's and Serve's output")
    args = p.parse_args(argv)
    with transcript(args.log) as terminal:
        try:
            result = run(args, terminal)
        except Exception as exc:
            logging.getLogger("jobs.bench.traffic").exception("bench failed")
            print(f"bench traffic: failed: {type(exc).__name__}: {exc} (log: {args.log})", file=terminal, flush=True)
            return 1
    print(json.dumps(result), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot([*(json.loads(Path(c).read_text()) for c in args.compare), result], args.plot)
    return 0
