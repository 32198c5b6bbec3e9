"""The unit KV cache on a workload: questions whose top units follow a Zipf popularity.

    python -m jobs.bench unit-cache --build artifacts/sample --requests 60
    python -m jobs.bench unit-cache --build artifacts/sample --set llm.model=qwen2.5-coder-1.5b-instruct

Query logs are skewed: a few pages answer most questions. Here request i reads the build's unit of
popularity rank r_i (r drawn with P(r) ~ r^-s, ``--zipf`` s = 1.1, over the ``--units`` longest
units of the build) as its top unit, then one other unit drawn uniformly, and asks one of a few
templated questions about a title of the top unit. Only the top unit repeats: the rest of every
prompt (the second unit, the question) is new, as it is for real traffic.

The same requests run three ways, each in a fresh process state, the reader's short answer only
(``long_answer`` off; the time is the time to the short answer):

* ``cache``: the LongReader with ``llm.unit_cache_mb`` (and ``--disk-mb`` of disk under it);
* ``nocache``: the same reader without it (``unit_cache_mb=0``, no prompt cache either);
* ``raw``: llama-cpp-python's ``create_chat_completion`` on the same messages, context reset
  before each (the floor the product's stack adds to).

Prints p50/p95 seconds per way, the hit rate and where hits came from, the bytes each cached unit
costs (and per prefix token), the cache's peak RAM and disk bytes against their budgets, whether
every answer equals the no-cache one, and the ratios; ends with a JSON line (``--out`` also writes it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from longrag.cli import number
from longrag.config import LLMConfig, ReaderConfig, load_config
from longrag.index.artifacts import ArtifactStore, load_shard_units
from longrag.reading.prompts import direct_messages, format_context
from longrag.types import Unit

TEMPLATES = (
    "What is {t} known for?",
    "When did {t} begin, according to the documents?",
    "Where is {t} located or based?",
    "Who is most closely associated with {t}?",
)


def zipf_ranks(n_requests: int, n_units: int, s: float, seed: int) -> list[int]:
    """``n_requests`` ranks in [0, n_units) with P(r) proportional to (r + 1) ** -s."""
    weights = np.arange(1, n_units + 1, dtype=np.float64) ** -s
    return np.random.default_rng(seed).choice(n_units, size=n_requests, p=weights / weights.sum()).tolist()


def workload(units: list[Unit], n_requests: int, s: float, seed: int) -> list[tuple[str, list[Unit]]]:
    """(question, [top unit, other unit]) per request (see the module doc)."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for i, rank in enumerate(zipf_ranks(n_requests, len(units), s, seed)):
        top = units[rank]
        other = units[int(rng.choice([j for j in range(len(units)) if j != rank]))]
        title = next((t for t in top.titles if t), top.unit_id)
        out.append((TEMPLATES[i % len(TEMPLATES)].format(t=title), [top, other]))
    return out


async def run_reader(llm_cfg: LLMConfig, reader_cfg: ReaderConfig, requests, log) -> dict[str, Any]:
    from longrag.llm import build_llm
    from longrag.llm.kvcache import CacheStats
    from longrag.reading.reader import LongReader

    llm = build_llm(llm_cfg)
    try:
        reader = LongReader(llm, reader_cfg)
        await reader.read("warm-up question?", requests[0][1][1:], long_answer=False)
        llm.forget_prefixes()
        if llm.unit_cache is not None:
            llm.unit_cache.stats = CacheStats()  # count the workload only
        rows = []
        for i, (question, units) in enumerate(requests):
            t0 = time.perf_counter()
            res = await reader.read(question, units, long_answer=False)
            rows.append({"s": time.perf_counter() - t0, "answer": res.answer, "unit_cache": res.unit_cache,
                         "prompt_tokens": res.prompt_tokens, "cached_tokens": res.cached_prompt_tokens})
            log(f"  {i + 1}/{len(requests)} {rows[-1]['s']:.2f}s {res.unit_cache or '-':7} {res.answer[:40]!r}")
        stats = llm.unit_cache.stats.to_dict() if llm.unit_cache is not None else None
        return {"rows": rows, "cache": stats}
    finally:
        llm.close()


def run_raw(llm_cfg: LLMConfig, reader_cfg: ReaderConfig, requests, log) -> list[float]:
    """llama-cpp-python alone on the reader's own messages (fitted as the reader fits them)."""
    from llama_cpp import Llama

    from longrag.llm import build_llm
    from longrag.llm.llamacpp import resolve_model_path, resolve_threads
    from longrag.reading.reader import LongReader

    fitter = LongReader(build_llm(llm_cfg.model_copy(update={"unit_cache_mb": 0})), reader_cfg)
    messages = []
    for question, units in requests:
        fitted = fitter.fit(question, units)
        messages.append(direct_messages(question, format_context(fitted.blocks)))
    fitter.llm.close()
    threads = resolve_threads(llm_cfg.n_threads)
    raw = Llama(model_path=str(resolve_model_path(llm_cfg.model)), n_ctx=llm_cfg.context_window, n_threads=threads,
                n_threads_batch=threads, n_batch=512, flash_attn=llm_cfg.flash_attn, chat_format="chatml", verbose=False)
    out = []
    for i, m in enumerate(messages):
        raw.reset()
        t0 = time.perf_counter()
        raw.create_chat_completion(messages=m, max_tokens=reader_cfg.short_answer_max_tokens, temperature=0.0,
                                   stop=["\nQuestion:"], seed=llm_cfg.seed)
        out.append(time.perf_counter() - t0)
        log(f"  raw {i + 1}/{len(messages)} {out[-1]:.2f}s")
    raw.close()
    return out


def summarize(seconds: list[float]) -> dict[str, float]:
    p50, p95 = np.percentile(seconds, [50, 95])
    return {"p50_s": round(float(p50), 2), "p95_s": round(float(p95), 2), "mean_s": round(float(np.mean(seconds)), 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobs.bench unit-cache", description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="artifacts/sample", help="a build written by jobs.index (make index)")
    p.add_argument("--requests", type=number(int, min_value=2), default=60)
    p.add_argument("--units", type=number(int, min_value=2), default=40, help="the longest units of the build")
    p.add_argument("--zipf", type=number(float, min_value=0), default=1.1, help="the popularity exponent s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ram-mb", type=number(int, min_value=1), default=64, help="the cache's RAM budget")
    p.add_argument("--disk-mb", type=number(int, min_value=0), default=256, help="the cache's disk budget")
    p.add_argument("--raw", type=number(int, min_value=0), default=12, help="requests timed raw (the first N)")
    p.add_argument("--set", action="append", default=[], help="config override, e.g. llm.model=...")
    p.add_argument("--out", help="also write the JSON result here")
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    cfg = load_config(None, args.set)
    store = ArtifactStore.open(args.build)
    units = [u for s in store.read_manifest().shards for u in load_shard_units(store, s.shard_id)]
    units = sorted(units, key=lambda u: (-u.n_tokens, u.unit_id))[: args.units]
    requests = workload(units, args.requests, args.zipf, args.seed)
    reader_cfg = cfg.reader
    base = cfg.llm.model_copy(update={"prompt_cache_mb": 0})
    load0 = os.getloadavg()
    result: dict[str, Any] = {"bench": "unit_cache", "model": cfg.llm.model, "requests": args.requests,
                              "units": len(units), "zipf_s": args.zipf, "distinct_top_units": len({id(r[1][0]) for r in requests}),
                              "ram_budget_mb": args.ram_mb, "disk_budget_mb": args.disk_mb, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="kv-") as kv_dir:
        log(f"bench unit-cache: {args.requests} requests over {len(units)} units (s={args.zipf}), with the cache")
        cached = asyncio.run(run_reader(base.model_copy(update={"unit_cache_mb": args.ram_mb, "unit_cache_disk_mb": args.disk_mb,
                                                                "unit_cache_dir": kv_dir}), reader_cfg, requests, log))
    log("bench unit-cache: without it")
    plain = asyncio.run(run_reader(base.model_copy(update={"unit_cache_mb": 0}), reader_cfg, requests, log))
    raw = run_raw(base, reader_cfg, requests[: args.raw], log) if args.raw else []
    c_s, n_s = [r["s"] for r in cached["rows"]], [r["s"] for r in plain["rows"]]
    stats = cached["cache"]
    # a hit: the top unit's state came from the cache, or the previous request left it in the context
    hits = [r for r in cached["rows"] if r["unit_cache"] in ("ram", "disk", "context")]
    misses = [r for r in cached["rows"] if r["unit_cache"] == "miss"]
    result.update({
        "cache": summarize(c_s), "nocache": summarize(n_s),
        "p50_ratio_cache_to_nocache": round(summarize(c_s)["p50_s"] / summarize(n_s)["p50_s"], 3),
        "hit_rate": round(len(hits) / len(c_s), 3),
        "hits_ram": stats["ram_hits"], "hits_disk": stats["disk_hits"], "misses": stats["misses"],
        "hits_context": sum(r["unit_cache"] == "context" for r in cached["rows"]),
        "hit_p50_s": summarize([r["s"] for r in hits])["p50_s"] if hits else None,
        "miss_p50_s": summarize([r["s"] for r in misses])["p50_s"] if misses else None,
        "bytes_per_cached_unit": round(stats["ram_bytes"] / max(stats["ram_entries"], 1)),
        "largest_entry_bytes": stats["largest_entry_bytes"],
        "bytes_per_prefix_token": round(np.mean([stats["largest_entry_bytes"] / max(r["cached_tokens"], 1)
                                                 for r in hits]) if hits else 0),
        "ram_peak_bytes": stats["ram_peak_bytes"], "disk_peak_bytes": stats["disk_peak_bytes"],
        "within_budgets": stats["ram_peak_bytes"] <= args.ram_mb << 20 and stats["disk_peak_bytes"] <= args.disk_mb << 20,
        "answers_equal": sum(a["answer"] == b["answer"] for a, b in zip(cached["rows"], plain["rows"])),
        "load_avg_start": [round(x, 2) for x in load0], "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    })
    if raw:
        k = len(raw)
        result["raw"] = summarize(raw)
        result["nocache_to_raw_p50"] = round(summarize(n_s[:k])["p50_s"] / summarize(raw)["p50_s"], 3)
        result["cache_to_raw_p50"] = round(summarize(c_s[:k])["p50_s"] / summarize(raw)["p50_s"], 3)
    line = json.dumps(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    print(line, flush=True)
    return 0 if result["within_budgets"] else 1
