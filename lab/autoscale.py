"""The autoscaling scenario of ``python -m jobs.autoscale_demo``, without Ray: the timeline of
nodes and replicas, the burst of requests, the figures and the plot.

* :class:`Timeline`: samples taken every second (worker nodes by type, running Serve replicas per
  deployment, requests in flight) and the scenario's events (index submitted, deploy, node killed);
* :func:`burst`: a bounded burst of ``/v1/retrieve`` and ``/v1/answer`` requests over HTTP at a
  fixed concurrency (a count and a time limit, whichever comes first), every outcome kept with its
  start time (:class:`lab.chaos.Outcome` classifies a response);
* :func:`plot`: the timeline as a PNG (nodes by type, replicas per deployment, load);
* :class:`AutoscaleFigures`: the job's one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, Field

from lab.chaos import SAMPLE_QUESTIONS, Outcome


@dataclass
class Sample:
    t: float  # seconds since the timeline's start
    nodes: dict[str, int]  # worker nodes alive, by node type
    replicas: dict[str, int]  # RUNNING replicas, by deployment
    in_flight: int


def scaled_down(now: Sample, before: Sample, scaled: Sequence[str], holding: Mapping[str, int]) -> bool:
    """After a burst: the ``scaled`` deployments at one replica, and no node type with more nodes
    than ``before`` it, except up to ``holding[type]``, the nodes of that type holding a shard
    replica (Serve may respread a lost node's replicas over two new nodes and never moves a
    running replica back, so neither is idle), and no node type that was not there before."""
    return all(v <= 1 for k, v in now.replicas.items() if k in scaled) and set(now.nodes) <= set(before.nodes) and all(
        now.nodes.get(k, 0) <= max(v, holding.get(k, 0)) for k, v in before.nodes.items())


@dataclass
class Timeline:
    """What the scenario saw, second by second; ``t0`` is ``time.monotonic()`` at the start."""

    t0: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    requests: list[tuple[float, float, int, bool]] = field(default_factory=list)  # start, end, status, degraded
    in_flight: int = 0  # requests of the burst sent and not answered yet

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def mark(self, label: str) -> float:
        t = self.now()
        self.events.append((t, label))
        return t

    def event(self, label: str) -> float | None:
        return next((t for t, name in self.events if name == label), None)

    def first(self, after: float, pred: Callable[[Sample], bool]) -> float | None:
        """The time of the first sample at or after ``after`` for which ``pred`` holds."""
        return next((s.t for s in self.samples if s.t >= after and pred(s)), None)

    def peak_nodes(self, since: float = 0.0, until: float = float("inf")) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.samples:
            if since <= s.t <= until:
                for k, v in s.nodes.items():
                    out[k] = max(out.get(k, 0), v)
        return out

    def replica_range(self, since: float = 0.0, until: float = float("inf")) -> dict[str, list[int]]:
        """``{deployment: [fewest, most]}`` running replicas between ``since`` and ``until``."""
        out: dict[str, list[int]] = {}
        for s in self.samples:
            if since <= s.t <= until:
                for k, v in s.replicas.items():
                    lo, hi = out.get(k, [v, v])
                    out[k] = [min(lo, v), max(hi, v)]
        return out


@dataclass(frozen=True)
class BurstPlan:
    requests: int = 600
    concurrency: int = 16
    max_s: float = 180.0
    answer_every: int = 40  # every n-th request is an /v1/answer, the others /v1/retrieve
    k: int = 4
    answer_k: int = 1  # units an answer reads (the LLM is the slow stage)
    request_timeout_s: float = 120.0


async def burst(base: str, plan: BurstPlan, timeline: Timeline,
                at: tuple[int, Callable[[], Any]] | None = None) -> list[Outcome]:
    """Send ``plan.requests`` requests (fewer when ``plan.max_s`` runs out), ``plan.concurrency`` at
    a time, to ``base`` (an address on this machine); ``at = (i, fn)`` runs ``fn`` in a thread once
    request ``i`` is sent (the others keep going). Every outcome goes to ``timeline.requests``."""
    outcomes: list[Outcome] = []
    fired: list[asyncio.Future] = []
    sent, deadline = 0, time.monotonic() + plan.max_s

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal sent
        while sent < plan.requests and time.monotonic() < deadline:
            i = sent
            sent += 1
            if at is not None and i == at[0]:
                fired.append(asyncio.get_running_loop().run_in_executor(None, at[1]))
            q = SAMPLE_QUESTIONS[i % len(SAMPLE_QUESTIONS)]
            answer = bool(plan.answer_every) and i % plan.answer_every == plan.answer_every - 1
            path = "/v1/answer" if answer else "/v1/retrieve"
            t = timeline.now()
            timeline.in_flight += 1
            try:
                r = await client.post(path, json={"question": q, "k": plan.answer_k if answer else plan.k})
                o = Outcome.of(r, (timeline.now() - t) * 1e3)
                if r.status_code == 200 and path == "/v1/answer":  # an answer's coverage is in its body too
                    cov = (r.json() or {}).get("coverage") or {}
                    o.degraded = bool(cov.get("degraded"))
            except httpx.HTTPError as exc:
                o = Outcome(status=0, ms=(timeline.now() - t) * 1e3, error=f"{type(exc).__name__}: {exc}")
            finally:
                timeline.in_flight -= 1
            outcomes.append(o)
            timeline.requests.append((t, timeline.now(), o.status, o.degraded))

    limits = httpx.Limits(max_connections=plan.concurrency + 2)
    async with httpx.AsyncClient(base_url=base, timeout=plan.request_timeout_s, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(plan.concurrency)))
    for f in fired:
        await f  # its error, if any, is the caller's
    return outcomes


class AutoscaleFigures(BaseModel):
    """The job's one JSON line (seconds from the event named, on this machine)."""

    job: str = "autoscale_demo"
    passed: bool
    wall_s: float
    load_avg: dict[str, list[float]] = Field(default_factory=dict, description="os.getloadavg() at start and end.")
    index_first_node_s: float | None = Field(None, description="Index job submitted -> first worker node up.")
    index_s: float | None = Field(None, description="Index job submitted -> job done (manifest complete).")
    index_nodes: dict[str, int] = Field(default_factory=dict, description="Most worker nodes up by type while indexing.")
    embedding_pool: str | None = Field(None, description="The index job's log line sizing its embedding pool.")
    manifest_complete: bool = False
    index_scale_down_s: float | None = Field(None, description="Index job done -> no worker node left.")
    serve_first_node_s: float | None = Field(None, description="Deploy -> first worker node up.")
    time_to_healthy_s: float | None = Field(None, description="Deploy -> /readyz ok.")
    shard_node_types: list[str] = Field(default_factory=list, description="Node type of every shard replica.")
    requests: int = 0
    requests_failed: int = Field(0, description="Responses other than 200 (5xx and no response included).")
    server_errors: int = 0
    degraded: int = Field(0, description="200s some shard did not answer (while a shard had no live replica).")
    killed_node_type: str | None = None
    kill_to_node_lost_s: float | None = Field(None, description="Node killed -> Ray and the autoscaler count it gone.")
    kill_to_new_node_s: float | None = Field(None, description="Node killed -> as many nodes of its type up as before.")
    kill_to_full_coverage_s: float | None = Field(None, description="Node killed -> /readyz ok (every replica live).")
    replicas: dict[str, list[int]] = Field(default_factory=dict, description="Deployment -> [fewest, most] "
                                           "running replicas from the burst on.")
    replicas_at_end: dict[str, int] = Field(default_factory=dict)
    time_to_scale_down_s: float | None = Field(None, description="Burst over -> replicas at their minimum and "
                                               "the nodes the burst added gone.")
    nodes_at_end: dict[str, int] = Field(default_factory=dict)
    healthy_at_end: bool = False
    problems: list[str] = Field(default_factory=list)
    error: str | None = None

    def line(self) -> str:
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"))


NODE_COLORS = {"cpu": "tab:blue", "index_cpu": "tab:green", "gpu_l4": "tab:purple"}


def plot(timeline: Timeline, path: str | Path, title: str = "") -> Path:
    """Nodes by type, running replicas per deployment and the load (requests in flight, failures),
    over time, with the scenario's events as vertical lines. Deployments that never had more than
    one replica are named in the legend's title instead of drawn."""
    from longrag.figures import pyplot, save_figure

    plt = pyplot()
    ts = [s.t for s in timeline.samples]
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True, gridspec_kw={"height_ratios": [1.2, 1.2, 1]})
    types = sorted({k for s in timeline.samples for k in s.nodes})
    for k in types:
        axes[0].step(ts, [s.nodes.get(k, 0) for s in timeline.samples], where="post", label=k,
                     color=NODE_COLORS.get(k))
    axes[0].set_ylabel("worker nodes")
    ranges = timeline.replica_range()
    flat = sorted(k for k, (lo, hi) in ranges.items() if hi <= 1)
    for k in sorted(set(ranges) - set(flat)):
        axes[1].step(ts, [s.replicas.get(k, 0) for s in timeline.samples], where="post", label=k)
    axes[1].set_ylabel("running replicas")
    axes[2].plot(ts, [s.in_flight for s in timeline.samples], color="tab:gray", label="requests in flight")
    done = [0] * (int(max(ts, default=0)) + 2)
    for _, end, _, _ in timeline.requests:
        done[min(int(end), len(done) - 1)] += 1
    axes[2].step(range(len(done)), done, where="post", color="tab:blue", lw=0.8, label="answered per second")
    failed = [end for _, end, status, _ in timeline.requests if status != 200]
    degraded = [end for _, end, status, d in timeline.requests if status == 200 and d]
    if degraded:
        axes[2].plot(degraded, [0.5] * len(degraded), "|", color="tab:orange", label="degraded (200)")
    if failed:
        axes[2].plot(failed, [0.5] * len(failed), "x", color="tab:red", label="failed")
    axes[2].set_ylabel("load")
    axes[2].set_xlabel("seconds")
    for i, ax in enumerate(axes):
        for t, _label in timeline.events:
            ax.axvline(t, color="k", lw=0.6, ls=":")
        legend = ax.legend(loc="upper left", fontsize=7, ncol=4,
                           title=("at most 1 replica: " + ", ".join(flat)) if i == 1 and flat else None)
        if legend.get_title():
            legend.get_title().set_fontsize(7)
        ax.grid(alpha=0.3)
    top = axes[0].get_ylim()[1]
    for t, label in timeline.events:
        axes[0].text(t, top, " " + label, rotation=90, va="top", fontsize=7)
    return save_figure(fig, path, dpi=90, title=title, title_size=10)
