"""Answers under traffic (issue 44): what a reader tier does when clients come faster than it answers,
and when they give up.

Three measurements over a running app's ``POST /v1/answer``, each from real HTTP clients on loopback:

* :func:`abandoned_burst`: a question asked alone (``unloaded``), then ``burst`` clients ask other
  questions and give up after ``give_up_s``, then one more question at once: its time against the
  unloaded one (the reader should not be writing answers nobody reads);
* :func:`crowd`: ``n`` clients at once; each must get its answer or a 503 with ``Retry-After``, and
  how long each waited for it;
* :func:`capacity`: answers per second of one client over the open loop's questions (warm);
* :func:`open_loop`: Poisson arrivals at a rate for ``duration_s`` (open loop: an arrival never waits
  for an earlier answer), a share of the clients giving up at a uniform time in ``abandon_s`` and the
  rest at ``patience_s``: goodput (answers delivered to a client still waiting, per second), p50/p99
  of those, 503s (with and without ``Retry-After``), other errors.

The tokens the LLM generated (and those it generated for calls that were then cancelled) come from
the LLMServer's own counters (``describe``), read by the caller before and after each phase; the
memory from :class:`longrag.memory.MemorySampler` over the benchmark's process and its descendants
(the local Ray). No Ray here: the benchmark wires the app in (``lab/bench/cli/traffic.py``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np

from lab.bench.load import latency_stats


@dataclass
class Outcome:
    """One request: when it was sent (s from the phase's start), how long its client waited, what
    it got (an HTTP status, "gave_up" or "error:<kind>") and whether a 503 said when to retry."""

    sent_s: float
    waited_s: float
    status: str
    retry_after: bool = False
    patience_s: float = 0.0


async def ask(client: httpx.AsyncClient, question: str, patience_s: float, k: int = 2) -> tuple[str, float, bool]:
    """One ``/v1/answer`` whose client waits at most ``patience_s`` (then closes the connection):
    ``(status, seconds waited, 503 had Retry-After)``."""
    t0 = time.perf_counter()
    try:
        r = await asyncio.wait_for(client.post("/v1/answer", json={"question": question, "k": k}), patience_s)
    except TimeoutError:
        return "gave_up", time.perf_counter() - t0, False
    except httpx.HTTPError as exc:
        return f"error:{type(exc).__name__}", time.perf_counter() - t0, False
    return str(r.status_code), time.perf_counter() - t0, r.status_code == 503 and "retry-after" in r.headers


async def unloaded(client: httpx.AsyncClient, questions: Sequence[str], patience_s: float = 120) -> list[float]:
    """Each question alone, one after another: seconds to its answer (a failure raises)."""
    out = []
    for q in questions:
        status, waited, _ = await ask(client, q, patience_s)
        if status != "200":
            raise RuntimeError(f"an unloaded question got {status}: {q!r}")
        out.append(waited)
    return out


async def abandoned_burst(client: httpx.AsyncClient, alone: Sequence[str], burst: Sequence[str], after: str,
                          give_up_s: float = 1.5, settle_s: float = 0.2) -> dict[str, Any]:
    """:func:`unloaded` over ``alone``, then ``burst`` clients that give up after ``give_up_s``,
    then ``after`` asked ``settle_s`` later: its time against the unloaded p50. Every question is
    new to the app (none shares a text with another), so each reads cold as far as the questions
    go; ``after`` is a question the burst did not ask."""
    base = await unloaded(client, alone)
    gave = await asyncio.gather(*(ask(client, q, give_up_s) for q in burst))
    await asyncio.sleep(settle_s)
    status, waited, _ = await ask(client, after, 300)
    p50 = float(np.median(base))
    return {"unloaded_s": [round(x, 3) for x in base], "unloaded_p50_s": round(p50, 3),
            "burst": len(burst), "give_up_s": give_up_s, "burst_statuses": sorted(s for s, _, _ in gave),
            "next_status": status, "next_s": round(waited, 3), "next_over_unloaded": round(waited / p50, 3)}


async def capacity(client: httpx.AsyncClient, questions: Sequence[str]) -> dict[str, Any]:
    """Answers per second of one client asking ``questions`` one after another, on a second pass
    (the open loop asks the same questions again and again, so its mix is the warm one: hot units'
    KV states cached): the open-loop rates are multiples of it. The first, warming pass is kept."""
    warm = await unloaded(client, questions)
    t0 = time.perf_counter()
    times = await unloaded(client, questions)
    wall = time.perf_counter() - t0
    return {"questions": len(questions), "answers_per_s": round(len(questions) / wall, 4),
            "p50_s": round(float(np.median(times)), 3), "mean_s": round(float(np.mean(times)), 3),
            "first_pass_mean_s": round(float(np.mean(warm)), 3)}


async def crowd(client: httpx.AsyncClient, questions: Sequence[str], patience_s: float = 120) -> dict[str, Any]:
    """Every question at once; the slowest outcome and how many were answered or refused."""
    res = await asyncio.gather(*(ask(client, q, patience_s) for q in questions))
    statuses = [s for s, _, _ in res]
    return {"clients": len(questions), "answered": statuses.count("200"), "shed": statuses.count("503"),
            "shed_with_retry_after": sum(1 for _, _, ra in res if ra),
            "other": sorted(s for s in statuses if s not in ("200", "503")),
            "max_wait_s": round(max(w for _, w, _ in res), 3),
            "answered_max_s": round(max((w for s, w, _ in res if s == "200"), default=0.0), 3),
            "shed_max_s": round(max((w for s, w, _ in res if s == "503"), default=0.0), 3)}


@dataclass
class Arrivals:
    """An open-loop schedule: Poisson arrivals at ``rate`` per second over ``duration_s``, each
    client's patience drawn once (``abandon_share`` of them uniform in ``abandon_s``, the rest
    ``patience_s``), from ``seed``: the same schedule for every run that compares."""

    rate: float
    duration_s: float
    abandon_share: float = 0.3
    abandon_s: tuple[float, float] = (0.5, 5.0)
    patience_s: float = 60.0
    seed: int = 0
    times: list[float] = field(default_factory=list)
    patience: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.duration_s <= 0:
            raise ValueError(f"rate and duration_s must be > 0, got {self.rate}, {self.duration_s}")
        rng = random.Random(self.seed)
        t = rng.expovariate(self.rate)
        while t < self.duration_s:
            self.times.append(t)
            self.patience.append(rng.uniform(*self.abandon_s) if rng.random() < self.abandon_share
                                 else self.patience_s)
            t += rng.expovariate(self.rate)


async def open_loop(client: httpx.AsyncClient, questions: Sequence[str], arrivals: Arrivals) -> dict[str, Any]:
    """Send ``arrivals``' requests on time (question i mod len), wait for every client to be done;
    goodput counts answers delivered before their client gave up, per second of the schedule."""
    t0 = time.perf_counter()
    outcomes: list[Outcome] = []

    async def one(i: int) -> None:
        await asyncio.sleep(max(0.0, arrivals.times[i] - (time.perf_counter() - t0)))
        sent = time.perf_counter() - t0
        status, waited, ra = await ask(client, questions[i % len(questions)], arrivals.patience[i])
        outcomes.append(Outcome(sent, waited, status, ra, arrivals.patience[i]))

    await asyncio.gather(*(one(i) for i in range(len(arrivals.times))))
    return summarize(outcomes, arrivals.duration_s, time.perf_counter() - t0)


def summarize(outcomes: Sequence[Outcome], duration_s: float, wall_s: float) -> dict[str, Any]:
    delivered = [o.waited_s * 1000 for o in outcomes if o.status == "200"]
    statuses = [o.status for o in outcomes]
    five = [s for s in statuses if s.startswith("5") and s != "503"]
    lat = latency_stats(delivered)
    return {"offered": len(outcomes), "offered_rps": round(len(outcomes) / duration_s, 4),
            "delivered": len(delivered), "goodput_rps": round(len(delivered) / duration_s, 4),
            "gave_up": statuses.count("gave_up"), "shed_503": statuses.count("503"),
            "shed_503_with_retry_after": sum(1 for o in outcomes if o.status == "503" and o.retry_after),
            "other_5xx": len(five), "other": sorted({s for s in statuses if s not in ("200", "503", "gave_up")}),
            "p50_s": round(lat.p50_ms / 1000, 3), "p99_s": round(lat.p99_ms / 1000, 3),
            "wall_s": round(wall_s, 1), "outcomes": [asdict(o) for o in outcomes]}
