"""lab.bench: latency statistics against numpy, closed-loop load levels (how many calls are in
flight, errors counted, never hidden), the overhead of serving and the scaling check."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import numpy as np
import pytest

from lab.bench import (
    LevelResult,
    grows_with_concurrency,
    latency_stats,
    machine,
    median_by_key,
    overhead,
    run_level,
    run_level_threads,
)


def test_latency_stats_are_numpys_percentiles():
    rng = np.random.default_rng(0)
    ms = rng.lognormal(3, 1, size=501).tolist()
    s = latency_stats(ms)
    assert s.n == 501
    assert s.p50_ms == round(float(np.percentile(ms, 50)), 2)
    assert s.p99_ms == round(float(np.percentile(ms, 99)), 2)
    assert s.mean_ms == round(float(np.mean(ms)), 2) and s.max_ms == round(max(ms), 2)
    assert latency_stats([5.0, 1.0, 3.0]).p50_ms == 3.0


def test_latency_stats_of_nothing_is_nan_and_bad_values_are_refused():
    empty = latency_stats([])
    assert empty.n == 0 and math.isnan(empty.p50_ms) and math.isnan(empty.p99_ms)
    with pytest.raises(ValueError, match="finite and >= 0"):
        latency_stats([1.0, float("nan")])
    with pytest.raises(ValueError, match="finite and >= 0"):
        latency_stats([-2.0])


def test_run_level_keeps_exactly_concurrency_calls_in_flight_and_times_each():
    in_flight = peak = 0
    seen: list[int] = []

    async def call(i: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        seen.append(i)
        return i

    res = asyncio.run(run_level("sleep", call, requests=40, concurrency=8))
    assert peak == 8 and sorted(seen) == list(range(40))
    assert res.ok == 40 and res.errors == 0 and res.latency.n == 40
    assert res.latency.p50_ms >= 10 and res.wall_s >= 0.05  # 40 calls of 10 ms, 8 at a time: >= 5 rounds
    assert res.throughput_rps == pytest.approx(40 / res.wall_s, rel=0.01)
    # closed loop: 8 at a time is faster than one at a time
    one = asyncio.run(run_level("sleep", call, requests=10, concurrency=1))
    assert one.wall_s >= 0.1 and res.throughput_rps > 2 * one.throughput_rps


def test_run_level_counts_failed_and_rejected_calls_and_keeps_their_messages():
    async def call(i: int) -> int:
        if i % 4 == 0:
            raise RuntimeError(f"boom {i}")
        return i

    res = asyncio.run(run_level("flaky", call, requests=12, concurrency=3,
                                check=lambda r: "odd" if r % 4 == 1 else None))
    assert res.ok == 6 and res.errors == 6 and res.latency.n == 6
    assert any(e.startswith("RuntimeError: boom") for e in res.error_examples)
    assert len(res.error_examples) == 3


def test_run_level_threads_runs_blocking_calls_on_concurrency_threads():
    lock = threading.Lock()
    in_flight = peak = 0

    def call(i: int) -> int:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.02)
        with lock:
            in_flight -= 1
        if i == 3:
            raise ValueError("bad input 3")
        return i

    res = run_level_threads("threads", call, requests=16, concurrency=4)
    assert peak == 4 and res.ok == 15 and res.errors == 1
    assert res.error_examples == ["ValueError: bad input 3"]
    assert res.latency.p50_ms >= 20


@pytest.mark.parametrize("requests, concurrency", [(0, 1), (5, 0)])
def test_a_level_needs_calls_and_concurrency(requests, concurrency):
    with pytest.raises(ValueError, match="must be >= 1"):
        run_level_threads("x", lambda i: i, requests=requests, concurrency=concurrency)


def _level(name: str, c: int, ms: list[float], wall: float) -> LevelResult:
    return LevelResult(name=name, concurrency=c, requests=len(ms), ok=len(ms), errors=0, wall_s=wall,
                       throughput_rps=len(ms) / wall, latency=latency_stats(ms))


def test_overhead_is_served_minus_and_over_in_process_at_one_concurrency():
    served, local = _level("http", 1, [30.0, 30.0, 40.0], 0.1), _level("local", 1, [10.0, 10.0, 20.0], 0.04)
    o = overhead(served, local)
    assert (o.concurrency, o.p50_ms, o.p50_ratio) == (1, 20.0, 3.0)
    assert o.p99_ms == round(served.latency.p99_ms - local.latency.p99_ms, 2)
    assert o.throughput_ratio == round(30 / 75, 3)
    with pytest.raises(ValueError, match="concurrency: 1 vs 8"):
        overhead(served, _level("local", 8, [1.0], 0.01))


def test_grows_with_concurrency():
    assert grows_with_concurrency({1: 15.0, 8: 24.0, 32: 31.0})
    assert not grows_with_concurrency({1: 15.0, 8: 24.0, 32: 20.0})  # fell at 32
    assert grows_with_concurrency({1: 15.0, 8: 24.0, 32: 23.0}, tolerance=0.1)
    assert not grows_with_concurrency({1: 15.0, 8: 14.0, 32: 14.5}, tolerance=0.1)  # no gain overall
    assert not grows_with_concurrency({1: 15.0})


def test_median_by_key_and_machine():
    rows = [{"a": 1.0, "b": 10.0}, {"a": 3.0}, {"a": 2.0, "b": 20.0}]
    assert median_by_key(rows) == {"a": 2.0, "b": 15.0}
    m = machine()
    assert m["cpus"] >= 1 and len(m["loadavg"]) == 3


def test_http_first_token_reads_the_sse_stream_and_the_summary_subtracts_medians():
    import json

    import httpx

    from lab.bench.serving import first_token_summary, http_first_token

    def chunk(delta):
        return "data: " + json.dumps({"choices": [{"delta": delta}]}) + "\n\n"

    async def body():
        yield chunk({"role": "assistant", "content": ""}).encode()  # no text yet: not the first token
        await asyncio.sleep(0.05)
        yield chunk({"reasoning_content": "Orwell wrote"}).encode()
        await asyncio.sleep(0.05)
        yield (chunk({"content": "George Orwell"}) + "data: [DONE]\n\n").encode()

    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x") as client:
            return await http_first_token(client, "Who wrote Animal Farm?", 2)

    got = asyncio.run(go())
    assert got["answer"] == "George Orwell" and got["error"] is None
    assert 40 <= got["first_token_ms"] < got["total_ms"] and got["total_ms"] >= 90
    s = first_token_summary([got, {**got, "first_token_ms": 70.0}], [{"first_token_ms": 10.0, "total_ms": 50.0}])
    assert s["requests"] == 2 and s["errors"] == 0
    assert s["first_token_overhead_p50_ms"] == round(s["http_first_token_p50_ms"] - 10.0, 1)
