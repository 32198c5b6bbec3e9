"""The traffic benchmark's measuring (lab/bench/traffic.py) against an in-process ASGI app that
answers slowly, refuses with 503 + Retry-After past a limit, and counts what it started: the
schedule is deterministic, a client that gives up is counted as such and never as delivered,
goodput counts only answers delivered in time. No Ray, no model."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from lab.bench.traffic import Arrivals, Outcome, abandoned_burst, crowd, open_loop, summarize


def _app(answer_s: float, limit: int):
    state = {"in_flight": 0, "started": 0}

    async def answer(request):
        if state["in_flight"] >= limit:
            return JSONResponse({"error": {"code": "overloaded"}}, status_code=503, headers={"Retry-After": "1"})
        state["in_flight"] += 1
        state["started"] += 1
        try:
            await asyncio.sleep(answer_s)
            return JSONResponse({"answer": "ok"})
        finally:
            state["in_flight"] -= 1

    return Starlette(routes=[Route("/v1/answer", answer, methods=["POST"])]), state


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=None)


def test_arrivals_are_a_fixed_poisson_schedule_with_drawn_patience():
    a, b = Arrivals(rate=5, duration_s=20, seed=3), Arrivals(rate=5, duration_s=20, seed=3)
    assert a.times == b.times and a.patience == b.patience
    assert 60 < len(a.times) < 140 and all(0 < t < 20 for t in a.times) and a.times == sorted(a.times)
    quick = [p for p in a.patience if p != 60.0]
    assert 0.15 < len(quick) / len(a.patience) < 0.45 and all(0.5 <= p <= 5.0 for p in quick)
    with pytest.raises(ValueError):
        Arrivals(rate=0, duration_s=1)


def test_open_loop_counts_gave_up_shed_and_delivered_apart():
    app, state = _app(answer_s=0.3, limit=1)
    arrivals = Arrivals(rate=20, duration_s=1.0, seed=1, abandon_share=0.5, abandon_s=(0.05, 0.1))

    async def go():
        async with _client(app) as client:
            return await open_loop(client, ["q"], arrivals)

    res = asyncio.run(go())
    assert res["offered"] == len(arrivals.times)
    assert res["delivered"] + res["gave_up"] + res["shed_503"] == res["offered"]
    assert res["shed_503"] == res["shed_503_with_retry_after"] > 0 and res["delivered"] >= 1
    assert res["goodput_rps"] == round(res["delivered"] / 1.0, 4) and res["other_5xx"] == 0
    assert all(o["waited_s"] < 0.2 for o in res["outcomes"] if o["status"] == "gave_up")


def test_the_burst_and_the_crowd():
    app, state = _app(answer_s=0.05, limit=2)

    async def go():
        async with _client(app) as client:
            burst = await abandoned_burst(client, ["a", "b"], ["c"] * 4, "d", give_up_s=0.01, settle_s=0.1)
            return burst, await crowd(client, ["q"] * 5)

    burst, many = asyncio.run(go())
    assert burst["next_status"] == "200" and len(burst["unloaded_s"]) == 2 and burst["burst"] == 4
    assert set(burst["burst_statuses"]) <= {"gave_up", "503"}
    assert many["answered"] == 2 and many["shed"] == many["shed_with_retry_after"] == 3 and many["other"] == []


def test_summary_of_no_delivered_answer_is_nan_latency():
    res = summarize([Outcome(0.0, 1.0, "gave_up"), Outcome(0.1, 0.0, "500")], duration_s=1.0, wall_s=1.0)
    assert res["delivered"] == 0 and res["other_5xx"] == 1 and res["p99_s"] != res["p99_s"]
