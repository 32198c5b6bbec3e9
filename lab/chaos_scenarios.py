"""The scenarios of ``python -m jobs.chaos``: faults injected into a running app while requests go
on, each judged by :mod:`lab.chaos`. The faults themselves (killing Serve replicas, a node, reading
Serve's applications) are the job's, passed in as :class:`Faults`; this module only speaks HTTP to
the app and times what it sees.

1. ``replica``: one replica of a shard killed; the load goes on until it is re-created;
2. ``shard``: both replicas of a shard killed a quarter into the requests;
3. ``llm``: the LLMServer replica killed while an answer is in flight, then during a streamed answer;
4. ``rollout``: updates published at once, the alias rolled back (:mod:`lab.chaos_rollout`);
5. ``node``: the node of a Retriever replica killed (its shard replicas with it); a new node joins
   as the autoscaler would add one, and the app returns to full redundancy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from lab.chaos import (
    ChaosPlan,
    LoadResult,
    Outcome,
    References,
    ScenarioResult,
    judge_llm,
    judge_node,
    judge_replica,
    judge_rollout,
    judge_shard,
    reference_top_k,
    references_problem,
    retrieve_load,
    wait_recovered,
)
from lab.chaos_rollout import rollout

log = logging.getLogger("jobs.chaos")


@dataclass
class Faults:
    """What the scenarios do to the cluster, and what they read of it (each a blocking call)."""

    kill_shard_replicas: Callable[[int, int], list[str]]  # (shard, n) -> the replicas killed
    kill_llm: Callable[[], str]  # one LLMServer replica -> its name
    apps: Callable[[], set[str]]  # Serve's application names now
    app_of: Callable[[str], str]  # a build id -> its index application's name
    kill_retriever_node: Callable[[], list[str]]  # a worker node with a Retriever replica -> what died
    add_node: Callable[[], None]  # one more worker node (the autoscaler's replacement); main thread
    retrievers: Callable[[], tuple[int, int]]  # Retriever replicas (running, wanted)


def watched_fault(client: httpx.AsyncClient, plan: ChaosPlan, injure: Callable[[], Awaitable[None]]
                  ) -> tuple[Callable[[], Awaitable[None]], list[asyncio.Future], asyncio.Event]:
    """A ``fault`` for :func:`lab.chaos.retrieve_load`: ``await injure()``, then /readyz watched for the
    recovery while the load goes on (``recovery[0]``); ``back`` is set once recovered, timed out, or
    if ``injure`` raised (the load's ``until``: it spans the whole outage)."""
    recovery: list[asyncio.Future] = []
    back = asyncio.Event()

    async def fault() -> None:
        t_kill = time.perf_counter()
        try:
            await injure()
        except BaseException:
            back.set()
            raise
        recovery.append(asyncio.ensure_future(wait_recovered(client, plan, t_kill)))
        recovery[-1].add_done_callback(lambda _: back.set())

    return fault, recovery, back


async def replica_scenario(client: httpx.AsyncClient, plan: ChaosPlan, faults: Faults, ref: References) -> ScenarioResult:
    killed: list[str] = []

    async def injure() -> None:
        killed.extend(await asyncio.to_thread(faults.kill_shard_replicas, plan.shard, 1))

    fault, recovery, back = watched_fault(client, plan, injure)
    outcomes = await retrieve_load(client, plan, plan.requests, at=int(plan.requests * plan.kill_at), fault=fault,
                                   ref=ref, until=back)
    res = ScenarioResult(name="replica", killed=killed, load=LoadResult.of(outcomes), recovery=await recovery[0])
    return judge_replica(res, plan)


async def shard_scenario(client: httpx.AsyncClient, plan: ChaosPlan, faults: Faults, ref: References) -> ScenarioResult:
    killed: list[str] = []
    recovery: list[asyncio.Future] = []

    async def fault() -> None:  # both replicas at once, while requests are in flight
        t_kill = time.perf_counter()
        killed.extend(await asyncio.to_thread(faults.kill_shard_replicas, plan.shard, 2))
        recovery.append(asyncio.ensure_future(wait_recovered(client, plan, t_kill)))

    outcomes = await retrieve_load(client, plan, plan.shard_requests, at=plan.shard_requests // 4, fault=fault,
                                   ref=ref)
    res = ScenarioResult(name="shard", killed=killed, load=LoadResult.of(outcomes), recovery=await recovery[0])
    return judge_shard(res, plan)


async def _sse(r: httpx.Response, first_token: asyncio.Event, events: list[tuple[str, Any]]) -> None:
    name = None
    async for line in r.aiter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name or "", json.loads(line[6:])))
            if name == "token":
                first_token.set()


async def llm_scenario(client: httpx.AsyncClient, plan: ChaosPlan, faults: Faults) -> ScenarioResult:
    """Kill the LLMServer replica 1.5 s into a plain answer (after retrieval, while the reader reads),
    then at the first token of a streamed one; then ask once more."""
    body = {"question": plan.answer_question, "k": 2}
    killed: list[str] = []
    t0 = time.perf_counter()
    answer = asyncio.ensure_future(client.post("/v1/answer", json=body))
    await asyncio.sleep(1.5)
    in_flight = not answer.done()
    killed.append(await asyncio.to_thread(faults.kill_llm))
    try:
        r = await answer
        got = Outcome.of(r, (time.perf_counter() - t0) * 1e3)
    except httpx.HTTPError as exc:
        got = Outcome(status=0, ms=(time.perf_counter() - t0) * 1e3, error=f"{type(exc).__name__}: {exc}")

    events: list[tuple[str, Any]] = []
    first_token = asyncio.Event()
    async with client.stream("POST", "/v1/answer", json={**body, "stream": True}) as r:
        reader = asyncio.ensure_future(_sse(r, first_token, events))
        try:
            await asyncio.wait_for(first_token.wait(), plan.request_timeout_s)
            killed.append(await asyncio.to_thread(faults.kill_llm))
        except TimeoutError:
            pass
        await asyncio.wait_for(reader, plan.request_timeout_s * 5)
    error = next((d["error"] for n, d in events if n == "error"), None)

    t1 = time.perf_counter()
    try:
        nxt = Outcome.of(await client.post("/v1/answer", json=body), (time.perf_counter() - t1) * 1e3)
    except httpx.HTTPError as exc:
        nxt = Outcome(status=0, ms=(time.perf_counter() - t1) * 1e3, error=f"{type(exc).__name__}: {exc}")
    res = ScenarioResult(name="llm", killed=killed, answer=got, in_flight_at_kill=in_flight, next_request=nxt,
                         stream_events=[n for n, _ in events], stream_error=error)
    return judge_llm(res)


async def rollout_scenario(client: httpx.AsyncClient, plan: ChaosPlan, faults: Faults, alias: str,
                           parent: tuple[str, str], updates: dict[str, str], ref: References) -> ScenarioResult:
    """:func:`lab.chaos_rollout.rollout` while requests go on (``plan.rollout_concurrency`` at a time)."""
    done = asyncio.Event()
    timeline: list[asyncio.Future] = []

    async def fault() -> None:
        timeline.append(asyncio.ensure_future(rollout(
            client, plan, alias, parent, updates, ref, faults.apps, faults.app_of)))
        timeline[-1].add_done_callback(lambda _: done.set())

    outcomes = await retrieve_load(client, plan.model_copy(update={"concurrency": plan.rollout_concurrency}), 20,
                                   at=5, fault=fault, ref=ref, until=done)
    res = ScenarioResult(name="rollout", killed=[], load=LoadResult.of(outcomes), rollout=await timeline[0])
    return judge_rollout(res)


async def node_scenario(client: httpx.AsyncClient, plan: ChaosPlan, faults: Faults, ref: References) -> ScenarioResult:
    """Kill the node of a Retriever replica while requests go on (its shard replicas die with it);
    ``plan.node_down_s`` later a new node joins; the load goes on until /readyz is ok again."""
    killed: list[str] = []

    async def injure() -> None:
        killed.extend(await asyncio.to_thread(faults.kill_retriever_node))
        await asyncio.sleep(plan.node_down_s)  # the app answers from what is left
        faults.add_node()  # in this thread: Ray starts a node only from the main thread (the loop pauses)

    fault, recovery, back = watched_fault(client, plan, injure)
    outcomes = await retrieve_load(client, plan, 40, at=10, fault=fault, ref=ref, until=back)
    res = ScenarioResult(name="node", killed=killed, load=LoadResult.of(outcomes), recovery=await recovery[0],
                         retrievers_after=await asyncio.to_thread(faults.retrievers))
    return judge_node(res, plan)


async def run_scenarios(base: str, plan: ChaosPlan, faults: Faults, alias: str, builds: dict[str, str],
                        single: References) -> list[ScenarioResult]:
    """``builds``: build id -> uri, the served one first, then its updates; ``single``: their top-k from a
    single index (:func:`lab.chaos_rollout.single_index_references`)."""
    limits = httpx.Limits(max_connections=plan.concurrency + 2)
    async with httpx.AsyncClient(base_url=base, timeout=plan.request_timeout_s * 5, limits=limits) as client:
        app = await reference_top_k(client, plan)  # every later 200 is checked against it (exact search)
        if why := references_problem(app, single):
            raise RuntimeError(why)
        ref = {**single, **app}
        (parent, *updates) = builds.items()
        steps = [lambda: replica_scenario(client, plan, faults, ref), lambda: shard_scenario(client, plan, faults, ref),
                 lambda: llm_scenario(client, plan, faults),
                 lambda: rollout_scenario(client, plan, faults, alias, parent, dict(updates), ref),
                 lambda: node_scenario(client, plan, faults, ref)]
        out: list[ScenarioResult] = []
        for step in steps:  # one after another: each starts from the full app the last one restored
            out.append(await step())
            log.warning("%s scenario: %s", out[-1].name, out[-1].model_dump_json())
        return out
