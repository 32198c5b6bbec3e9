"""The unit KV cache across LLM replicas: Serve's default router against unit-cache affinity.

    python -m jobs.bench unit-routing                       # 2 replicas of the 0.5B, 80 requests
    python -m jobs.bench unit-routing --replicas 2 --requests 120 --unit-cache-mb 24

The LLMServer deployment (the real llama.cpp engine, one thread and one CPU per replica, the unit
cache in RAM only: ``unit_cache_disk_mb=0``, ``prompt_cache_mb=0``, so a hit is the replica's own)
is deployed twice on one local Ray + Serve: routed by Serve's power of two choices
(``serve.llm_routing=pow2``) and by :class:`serve.routing.UnitAffinityRouter` (``unit_affinity``).
The same requests go to each through a deployment handle, ``--clients`` at a time: request i reads
the unit of Zipf popularity rank r_i (``lab.bench.cli.unit_cache.workload``: P(r) ~ r^-s over the
``--units`` longest grouped units of the HotpotQA sample, each cut to ``--prefix-words`` words) as its
top unit plus one other unit, with the reader's direct prompt and the top unit's head as the
``cache_prefix`` (what the Reader sends). Prints per router the unit-cache hit rate (a hit: the
replica held the top unit's KV state), where the requests went, p50/p95 seconds per call and the
ratios, and how many answers the two routers gave alike (all, with greedy decoding: a hit answers as a cold
read does); ends with a JSON line (``--out`` also writes it). Hit counts do not depend on the machine's
load; the seconds do (the load average is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from lab.bench.cli.unit_cache import workload
from longrag.cli import number
from longrag.config import LongRAGConfig
from longrag.eval.corpus import pool_examples
from longrag.eval.datasets import load_qa
from longrag.eval.links import build_links
from longrag.eval.plan import DATASET_FORMATS, LINK_METHODS
from longrag.index.units import make_units
from longrag.reading.prompts import direct_messages, documents_head, format_context, format_unit
from longrag.text.tokens import WhitespaceCounter
from longrag.types import Unit

ROUTERS = ("pow2", "unit_affinity")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sample_units(data: str, n: int, words: int) -> list[Unit]:
    """The ``n`` longest grouped units of the HotpotQA sample (title links), each cut to ``words`` words."""
    examples = load_qa(data, DATASET_FORMATS["hotpotqa"]).examples
    docs = build_links(pool_examples(examples).documents, LINK_METHODS["titles"])
    units = make_units(docs, kind="grouped", counter=WhitespaceCounter(1.3), budget=4096)
    units.sort(key=lambda u: -len(u.text))
    return [Unit(u.unit_id, u.doc_ids, u.titles, " ".join(u.text.split(" ")[:words]), 0) for u in units[:n]]


async def drive(handle: Any, requests: list[tuple[str, list[Unit]]], clients: int, max_tokens: int) -> list[dict]:
    """Every request through the handle, ``clients`` in flight; each one's cache source, replica and seconds."""
    rows: list[dict[str, Any]] = [{} for _ in requests]
    todo = iter(range(len(requests)))

    async def client() -> None:
        for i in todo:
            question, units = requests[i]
            blocks = [format_unit(u) for u in units]
            t0 = time.perf_counter()
            res = await handle.chat.remote(direct_messages(question, format_context(blocks)), max_tokens, 0.0, None,
                                           cache_prefix=documents_head(blocks))
            rows[i] = {"s": time.perf_counter() - t0, "unit_cache": res.prefix_cache, "top": units[0].unit_id,
                       "replica": res.model, "answer": res.text}
            log(f"  {i + 1}/{len(requests)} {rows[i]['s']:.2f}s {res.prefix_cache or '-':7} {res.model}")

    await asyncio.gather(*(client() for _ in range(clients)))
    return rows


def summarize(rows: list[dict]) -> dict[str, Any]:
    secs = np.array([r["s"] for r in rows])
    hits = sum(r["unit_cache"] in ("ram", "disk", "context") for r in rows)
    homes: dict[str, set[str]] = {}
    for r in rows:
        homes.setdefault(r["top"], set()).add(r["replica"])
    return {"requests": len(rows), "hits": hits, "hit_rate": round(hits / len(rows), 3),
            "p50_s": round(float(np.percentile(secs, 50)), 2), "p95_s": round(float(np.percentile(secs, 95)), 2),
            "mean_s": round(float(secs.mean()), 2), "per_replica": dict(Counter(r["replica"] for r in rows)),
            "replicas_per_unit": round(float(np.mean([len(v) for v in homes.values()])), 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobs.bench unit-routing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/hotpotqa/hotpotqa_train100.json.gz")
    p.add_argument("--replicas", type=number(int, min_value=1), default=2)
    p.add_argument("--requests", type=number(int, min_value=1), default=80)
    p.add_argument("--units", type=number(int, min_value=2), default=40, help="distinct top units (Zipf ranks)")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--prefix-words", type=number(int, min_value=10), default=200, help="words of each unit read")
    p.add_argument("--unit-cache-mb", type=number(int, min_value=1), default=24,
                   help="each replica's RAM for unit KV states (~12 KB per prefix token with the 0.5B)")
    p.add_argument("--clients", type=number(int, min_value=1), default=2)
    p.add_argument("--max-tokens", type=number(int, min_value=1), default=4)
    p.add_argument("--routers", default=",".join(ROUTERS), help="comma list of serve.llm_routing values")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON summary here")
    args = p.parse_args(argv)
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    if not set(routers) <= set(ROUTERS):
        p.error(f"--routers takes {', '.join(ROUTERS)}")
    requests = workload(sample_units(args.data, args.units, args.prefix_words), args.requests, args.zipf, args.seed)
    import ray
    from ray import serve

    from serve.app import llm_router_options
    from serve.deployments import LLMServer

    ray.init(num_cpus=max(2, args.replicas), include_dashboard=False, namespace="longrag-bench")
    results: dict[str, Any] = {}
    answers: dict[str, list[str]] = {}
    try:
        for router in routers:
            cfg = LongRAGConfig().with_overrides([
                f"serve.llm_routing={router}", "llm.n_threads=1", f"llm.unit_cache_mb={args.unit_cache_mb}",
                "llm.unit_cache_disk_mb=0", "llm.prompt_cache_mb=0"])
            app = LLMServer.options(num_replicas=args.replicas, ray_actor_options={"num_cpus": 1},
                                    **llm_router_options(cfg)).bind(cfg.llm, _NamedEngine)
            handle = serve.run(app, name=f"routing-{router}", route_prefix=None)
            log(f"{router}: {args.replicas} replicas up; {len(requests)} requests")
            t0 = time.perf_counter()
            rows = asyncio.run(drive(handle, requests, args.clients, args.max_tokens))
            results[router] = {**summarize(rows), "wall_s": round(time.perf_counter() - t0, 1)}
            answers[router] = [r["answer"] for r in rows]
            log(f"{router}: {json.dumps(results[router])}")  # each router's figures as soon as they are in
            serve.delete(f"routing-{router}")
    finally:
        serve.shutdown()
        ray.shutdown()
    summary = {"replicas": args.replicas, "requests": args.requests, "units": args.units, "zipf": args.zipf,
               "prefix_words": args.prefix_words, "unit_cache_mb": args.unit_cache_mb, "clients": args.clients,
               "load_avg": [round(x, 2) for x in os.getloadavg()], "routers": results}
    if {"pow2", "unit_affinity"} <= set(results):
        a, b = results["unit_affinity"], results["pow2"]
        summary["hit_rate_ratio"] = round(a["hit_rate"] / b["hit_rate"], 2) if b["hit_rate"] else None
        summary["p50_ratio"] = round(a["p50_s"] / b["p50_s"], 2)
        # greedy decoding, and a unit-cache hit answers as a cold read does: the routers must not change an answer
        summary["same_answers"] = sum(x == y for x, y in zip(answers["pow2"], answers["unit_affinity"]))
    print("| router | hit rate | hits | p50 s | p95 s | replicas per unit | per replica |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['hit_rate']:.1%} | {r['hits']}/{r['requests']} | {r['p50_s']} | {r['p95_s']} | "
              f"{r['replicas_per_unit']} | {sorted(r['per_replica'].values())} |")
    line = json.dumps(summary)
    print(line)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    return 0


def _NamedEngine(config: Any) -> Any:
    """The real engine (:func:`serve.llm_handle.build_engine`) whose results name the replica they ran on."""
    from ray import serve

    from serve.llm_handle import build_engine

    engine = build_engine(config)
    replica = serve.get_replica_context().replica_id.unique_id
    chat = engine.chat

    async def named_chat(*a: Any, **kw: Any) -> Any:
        res = await chat(*a, **kw)
        res.model = replica
        return res

    engine.chat = named_chat
    return engine
