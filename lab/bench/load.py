"""Load levels and latency statistics: the measuring part of the serving benchmarks.

A *level* sends ``requests`` calls with ``concurrency`` of them in flight at any time (closed loop:
each worker starts its next call when its last one returned) and records every call's latency.
:func:`run_level` drives async calls (HTTP clients), :func:`run_level_threads` blocking calls on a
thread pool of the same size (the in-process baseline: torch, FAISS and llama.cpp release the GIL).
:func:`overhead` compares a served level with the same work called in process, at the same
concurrency, so the cost of serving is a ratio and a difference measured in one run.

Percentiles are numpy's (linear interpolation between the two nearest samples); latencies of failed
calls are left out of the statistics and counted as errors, with their first messages kept.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: A check of one call's result: None when it is good, else what is wrong with it.
Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class LatencyStats:
    """Latency figures of a set of calls, in milliseconds (NaN when there were none)."""

    n: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float


def latency_stats(ms: Sequence[float], digits: int = 2) -> LatencyStats:
    """p50/p99/mean/max of ``ms``; NaN figures for an empty sequence."""
    a = np.asarray(list(ms), dtype=np.float64)
    if a.size == 0:
        nan = float("nan")
        return LatencyStats(0, nan, nan, nan, nan)
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"latencies must be finite and >= 0 ms, got {a[~np.isfinite(a) | (a < 0)][:3].tolist()}")
    p50, p99 = np.percentile(a, [50, 99])
    return LatencyStats(int(a.size), round(float(p50), digits), round(float(p99), digits),
                        round(float(a.mean()), digits), round(float(a.max()), digits))


@dataclass
class LevelResult:
    """One load level of one kind of call."""

    name: str
    concurrency: int
    requests: int
    ok: int
    errors: int
    wall_s: float
    throughput_rps: float = field(metadata={"doc": "successful calls per second of wall time"})
    latency: LatencyStats
    error_examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_args(requests: int, concurrency: int) -> None:
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")


def _result(name: str, concurrency: int, requests: int, ms: list[float], problems: list[str],
            wall_s: float) -> LevelResult:
    ok = len(ms)
    return LevelResult(name=name, concurrency=concurrency, requests=requests, ok=ok, errors=len(problems),
                       wall_s=round(wall_s, 3), throughput_rps=round(ok / wall_s, 3) if wall_s > 0 else 0.0,
                       latency=latency_stats(ms), error_examples=problems[:3])


def _problem(result: Any, check: Check | None) -> str | None:
    return check(result) if check is not None else None


async def run_level(name: str, call: Callable[[int], Awaitable[Any]], *, requests: int, concurrency: int,
                    check: Check | None = None) -> LevelResult:
    """``requests`` calls ``call(i)`` (i = 0..requests-1), ``concurrency`` in flight at a time."""
    _check_args(requests, concurrency)
    ms: list[float] = []
    problems: list[str] = []
    next_i = iter(range(requests))

    async def worker() -> None:
        for i in next_i:  # one shared iterator: each index is taken by exactly one worker
            t0 = time.perf_counter()
            try:
                problem = _problem(await call(i), check)
            except Exception as exc:  # counted and reported, never hidden
                problem = f"{type(exc).__name__}: {exc}"
            elapsed = (time.perf_counter() - t0) * 1e3
            if problem is None:
                ms.append(elapsed)
            else:
                problems.append(problem[:300])

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
    return _result(name, concurrency, requests, ms, problems, time.perf_counter() - t0)


def run_level_threads(name: str, call: Callable[[int], Any], *, requests: int, concurrency: int,
                      check: Check | None = None) -> LevelResult:
    """Like :func:`run_level` for a blocking ``call(i)``, on ``concurrency`` threads."""
    _check_args(requests, concurrency)

    def timed(i: int) -> tuple[float, str | None]:
        t0 = time.perf_counter()
        try:
            problem = _problem(call(i), check)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        return (time.perf_counter() - t0) * 1e3, problem

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(concurrency, requests)) as pool:
        outcomes = list(pool.map(timed, range(requests)))
    wall = time.perf_counter() - t0
    return _result(name, concurrency, requests, [m for m, p in outcomes if p is None],
                   [p[:300] for _, p in outcomes if p is not None], wall)


@dataclass(frozen=True)
class Overhead:
    """What serving adds to the same work done in process, at one concurrency."""

    concurrency: int
    p50_ms: float  # served p50 - in-process p50
    p99_ms: float
    p50_ratio: float  # served p50 / in-process p50
    throughput_ratio: float  # served throughput / in-process throughput

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def overhead(served: LevelResult, baseline: LevelResult) -> Overhead:
    """``served`` against ``baseline`` (same work in process); both at the same concurrency."""
    if served.concurrency != baseline.concurrency:
        raise ValueError(f"levels differ in concurrency: {served.concurrency} vs {baseline.concurrency}")
    s, b = served.latency, baseline.latency

    def ratio(x: float, y: float) -> float:
        return round(x / y, 3) if y > 0 else float("nan")

    return Overhead(concurrency=served.concurrency, p50_ms=round(s.p50_ms - b.p50_ms, 2),
                    p99_ms=round(s.p99_ms - b.p99_ms, 2), p50_ratio=ratio(s.p50_ms, b.p50_ms),
                    throughput_ratio=ratio(served.throughput_rps, baseline.throughput_rps))


def grows_with_concurrency(throughput: Mapping[int, float], tolerance: float = 0.0) -> bool:
    """Whether throughput (concurrency -> calls/s) does not fall from one concurrency to the next
    and the highest level beats the lowest (``tolerance``: the relative dip between neighbours
    still accepted)."""
    rps = [throughput[c] for c in sorted(throughput)]
    if len(rps) < 2:
        return False
    return rps[-1] > rps[0] and all(b >= a * (1 - tolerance) for a, b in zip(rps, rps[1:]))


def median_by_key(rows: Sequence[Mapping[str, float]], digits: int = 2) -> dict[str, float]:
    """The median of every key over ``rows`` (each row: one call's figures, e.g. its trace)."""
    keys = sorted({k for row in rows for k in row})
    return {k: round(float(np.median([row[k] for row in rows if k in row])), digits) for k in keys}


def machine() -> dict[str, Any]:
    """The CPUs this process may use and the load average now (figures depend on both)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 0
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {"cpus": cpus, "loadavg": load}
