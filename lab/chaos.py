"""Faults under load, over HTTP: the plan, the records and the verdict of ``python -m jobs.chaos``.

No Ray here: the load is plain HTTP (``httpx``) against a running app, and the faults are injected
through callables the job passes in (:mod:`serve.faults` kills replicas of the running app). The
first scenarios (the production-serving issue, "Operable and safe"; the rollout and node
scenarios are in :mod:`lab.chaos_scenarios`):

* ``replica``: ``requests`` ``/v1/retrieve`` calls at ``concurrency`` while one replica of a shard
  is killed for good: 0 failed, 0 wrong, and the tier re-creates the replica (full redundancy back).
  The responses that saw the lost redundancy are counted (``coverage.redundancy_degraded``) but not
  required: a Retriever reads the counts at its health check and /readyz, and with the node's shard
  cache warm Serve can replace the replica (~1-2 s) before any read falls in the gap;
* ``shard``: both replicas of one shard killed: the responses meanwhile are flagged degraded with
  the shard named (``coverage.failed_shards``) or, on the Serve shard tier, wait for the new
  replicas within the stage deadline; never a 5xx, and full coverage is back after the tier
  re-created the replicas;
* ``llm``: the LLM replica killed while an answer is in flight: a JSON 503 naming the stage (or,
  when the retry reached a restarted replica in time, the answer), never a plain 500, and the
  next request succeeds; the same for a streamed answer that already started (an error event).
"""

from __future__ import annotations

import asyncio
import collections
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field

from serve.run import readiness

# Questions about the bundled enwiki sample (data/sample); any question works, these hit several shards.
SAMPLE_QUESTIONS = (
    "Who wrote the novel Animal Farm?",
    "Which spaceflight first landed humans on the Moon?",
    "What is the capital of Angola?",
    "Who composed An American in Paris?",
    "Which country is Aruba a constituent country of?",
    "What is anarchism?",
    "Who was Alexander the Great?",
    "What is the atomic number of aluminium?",
)


class ChaosPlan(BaseModel):
    """What the job does; bounded in count and time."""

    requests: int = Field(1000, ge=10, description="/v1/retrieve requests of the replica scenario (at least: "
                          "they go on until the replica is back).")
    concurrency: int = Field(8, ge=1, le=64)
    k: int = Field(4, ge=1)
    kill_at: float = Field(0.1, gt=0, lt=1, description="Fraction of the requests sent before the kill.")
    shard: int = Field(0, ge=0, description="The shard whose replica(s) are killed.")
    shard_requests: int = Field(100, ge=10, description="Requests of the shard scenario (the kill a quarter in).")
    recovery_timeout_s: float = Field(120.0, gt=0, description="How long re-creation may take.")
    report_lag_s: float = Field(10.0, ge=0, description="Only /readyz reports built this long after the kill count "
                                "for recovery: Serve's replica counts lag a kill by up to a health-check period "
                                "(5 s for the shard deployments), and /readyz still says 'ok' before.")
    request_timeout_s: float = Field(60.0, gt=0)
    node_down_s: float = Field(10.0, ge=0, description="How long the app runs on what is left of a killed node "
                               "before a new node joins (the autoscaler's replacement).")
    retire_after_s: float = Field(20.0, ge=0, description="The app's index.retire_after_s: the rollout's rollback "
                                  "lands within it.")
    rollout_dwell_s: float = Field(2.0, ge=0, description="How long the app serves the published update before "
                                   "the rollback (well within retire_after_s).")
    rollout_concurrency: int = Field(2, ge=1, le=64, description="Requests at a time during the rollout (new "
                                     "builds' shard replicas start meanwhile).")
    answer_question: str = "Who wrote the novel Animal Farm?"
    questions: tuple[str, ...] = SAMPLE_QUESTIONS


RankedUnit = tuple[str, int, float]  # (unit_id, shard, score) of one retrieved unit, in rank order


class Outcome(BaseModel):
    """One HTTP request of a scenario."""

    status: int = Field(description="HTTP status; 0: no response (connection error or client timeout).")
    ms: float
    degraded: bool = False
    redundancy_degraded: bool = False
    failed_shards: list[int] = Field(default_factory=list)
    failovers: int = 0
    retries: int = Field(0, description="Stages the ingress retried after a failure (trace.*_retries).")
    error: str | None = Field(None, description="error.code and message of an error response, or the client error.")
    json_error: bool = Field(False, description="An error response in the one JSON shape {error: {code, message, detail}}.")
    question: str | None = Field(None, description="The question asked (retrieve load).")
    units: list[RankedUnit] = Field(default_factory=list, description="A 200's ranked units: (unit_id, shard, score).")
    build_id: str | None = Field(None, description="The build that answered a 200 (trace.build_id).")
    wrong: bool = Field(False, description="The units differ from the fault-free top-k (see top_k_problem).")

    @classmethod
    def of(cls, r: httpx.Response, ms: float) -> Outcome:
        try:
            body = r.json()
        except ValueError:
            body = None
        ms = round(ms, 1)
        if r.status_code == 200 and isinstance(body, dict) and "coverage" in body:
            cov, trace = body["coverage"], body.get("trace") or {}
            retries = sum(v for key, v in trace.items() if key.endswith("_retries") and isinstance(v, int))
            units = [(u["unit_id"], u["shard"], u["score"]) for u in body.get("units") or ()]
            return cls(status=200, ms=ms, degraded=cov["degraded"], redundancy_degraded=cov["redundancy_degraded"],
                       failed_shards=cov["failed_shards"], failovers=cov["failovers"], retries=retries, units=units,
                       build_id=trace.get("retrieve.build_id"))
        err = body.get("error") if isinstance(body, dict) else None
        shaped = isinstance(err, dict) and {"code", "message", "detail"} <= set(err)
        text = f"{err['code']}: {err['message']}" if shaped else r.text[:300]
        return cls(status=r.status_code, ms=ms, error=None if r.status_code == 200 else text, json_error=shaped)


class LoadResult(BaseModel):
    """The figures of a run of requests."""

    requests: int
    ok: int = Field(description="HTTP 200.")
    failed: int = Field(description="Anything but 200 (server errors and no response included).")
    server_errors: int = Field(description="HTTP 5xx or no response.")
    degraded: int = Field(description="200s some shard did not answer (coverage.degraded).")
    redundancy_degraded: int = Field(description="200s with a shard short of replicas (coverage.redundancy_degraded).")
    failovers: int
    failed_shards: list[int] = Field(description="Every shard named as not answering, ascending.")
    p50_ms: float | None
    p99_ms: float | None
    errors: list[str] = Field(default_factory=list, description="Up to 5 distinct error lines.")
    checked: int = Field(0, description="200s whose units were compared with the fault-free top-k.")
    wrong: int = Field(0, description="200s whose units were not the fault-free top-k (or, degraded, its units "
                       "on the shards that answered, in the same order).")
    builds: dict[str, int] = Field(default_factory=dict, description="200s per build that answered, in the order "
                                   "each build first answered.")

    @classmethod
    def of(cls, outcomes: list[Outcome]) -> LoadResult:
        ms = sorted(o.ms for o in outcomes)
        return cls(
            requests=len(outcomes), ok=sum(o.status == 200 for o in outcomes),
            failed=sum(o.status != 200 for o in outcomes),
            server_errors=sum(o.status >= 500 or o.status == 0 for o in outcomes),
            degraded=sum(o.degraded for o in outcomes),
            redundancy_degraded=sum(o.redundancy_degraded for o in outcomes),
            failovers=sum(o.failovers for o in outcomes),
            failed_shards=sorted({s for o in outcomes for s in o.failed_shards}),
            p50_ms=round(statistics.median(ms), 1) if ms else None,
            p99_ms=round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1) if ms else None,
            errors=sorted({o.error for o in outcomes if o.error})[:5],
            checked=sum(o.status == 200 and o.question is not None for o in outcomes),
            wrong=sum(o.wrong for o in outcomes),
            builds=dict(collections.Counter(o.build_id for o in outcomes if o.status == 200 and o.build_id)),
        )


class Recovery(BaseModel):
    recovered: bool
    seconds: float = Field(description="From the kill until /readyz said ok with every replica live (in a "
                           "report built after the kill: its age_s).")
    redundancy: str = Field(description="/readyz's redundancy at the end.")
    full_coverage_after: bool = Field(False, description="A retrieve after recovery answered from every shard "
                                      "with every replica live.")


class Rollout(BaseModel):
    """The rollout scenario's timeline: two updates of the served build published at once from it,
    then the alias rolled back to it within ``index.retire_after_s`` of the switch."""

    parent: str = Field(description="The build served before (and after the rollback).")
    race: dict[str, str] = Field(default_factory=dict, description="Each racing update's build id -> 'published' "
                                 "or the error its publish got.")
    winner: str | None = Field(None, description="The update that published (exactly one must).")
    switch_s: float | None = Field(None, description="From the publish until a request was answered by the winner.")
    rollback_s: float | None = Field(None, description="From the rollback until a request was answered by the parent "
                                     "again.")
    parent_kept: bool | None = Field(None, description="The parent's index application still present past the "
                                     "deadline of its retirement (the switch + retire_after_s).")
    winner_deleted_s: float | None = Field(None, description="From the rollback until the winner's application was "
                                           "deleted (its retirement); None: not within the wait.")
    loser_app: bool | None = Field(None, description="Whether an application of the losing update ever showed.")
    differing: int | None = Field(None, description="Questions whose exact top-k differs between the parent and the "
                                  "winner (answers the per-build check tells apart).")
    error: str | None = Field(None, description="Why the timeline stopped early, if it did.")


class ScenarioResult(BaseModel):
    name: Literal["replica", "shard", "llm", "rollout", "node"]
    killed: list[str] = Field(description="What was killed (actor names).")
    load: LoadResult | None = None
    recovery: Recovery | None = None
    answer: Outcome | None = Field(None, description="llm: the answer in flight at the kill.")
    in_flight_at_kill: bool | None = None
    stream_events: list[str] = Field(default_factory=list, description="llm: the SSE events of the streamed answer.")
    stream_error: dict[str, Any] | None = None
    next_request: Outcome | None = None
    rollout: Rollout | None = None
    retrievers_after: tuple[int, int] | None = Field(None, description="node: Retriever replicas (running, wanted) "
                                                     "after the recovery.")
    problems: list[str] = Field(default_factory=list, description="Expectations not met (empty: passed).")

    @property
    def passed(self) -> bool:
        return not self.problems


class ChaosSummary(BaseModel):
    """The job's one JSON line."""

    job: Literal["chaos"] = "chaos"
    passed: bool
    wall_s: float
    plan: dict[str, Any]
    load_avg: dict[str, list[float]] = Field(default_factory=dict, description="os.getloadavg() at start and end.")
    scenarios: list[ScenarioResult]
    error: str | None = Field(None, description="Why the job stopped before the scenarios ended, if it did.")

    def line(self) -> str:
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"))


# ---------------------------------------------------------------------------- exact top-k

TopK = dict[str, list[RankedUnit]]  # question -> its fault-free ranked units
References = dict[str, TopK]  # build id -> its TopK: a response is checked against the build that answered it


def top_k_problem(got: Outcome, ref: list[RankedUnit], score_tol: float = 1e-4) -> str | None:
    """Why ``got`` (a 200) is not the exact top-k that ``ref`` (the same question, every shard answering,
    before any fault) is, or None. Exact search is deterministic: with every shard answering the units
    must be ``ref``'s, in order; degraded (shards named in ``failed_shards``), ``ref``'s units on the
    shards that answered must open the list, in order, and none may come from a failed shard. Two units
    whose scores are within ``score_tol`` may trade places (a tie; the query vector's last bits can
    differ with its encoding batch)."""
    failed = set(got.failed_shards)
    want = [u for u in ref if u[1] not in failed]
    if not got.degraded and len(got.units) != len(ref):
        return f"{len(got.units)} units, expected {len(ref)}"
    if any(u[1] in failed for u in got.units):
        return f"a unit from a failed shard {sorted(failed)}"
    if len(got.units) < len(want):
        return f"{len(got.units)} units, expected at least {len(want)}"
    for i, (w, g) in enumerate(zip(want, got.units)):
        if w[0] != g[0] and abs(w[2] - g[2]) > score_tol:
            return f"rank {i + 1}: {g[0]} ({g[2]:.4f}), expected {w[0]} ({w[2]:.4f})"
    return None


async def reference_top_k(client: httpx.AsyncClient, plan: ChaosPlan) -> References:
    """Each question once, before any fault: the top-k every later response of the build served
    now is checked against."""
    ref: TopK = {}
    builds = set()
    for q in plan.questions:
        r = await client.post("/v1/retrieve", json={"question": q, "k": plan.k})
        got = Outcome.of(r, 0.0)
        if got.status != 200 or got.degraded or not got.units or not got.build_id:
            raise RuntimeError(f"the fault-free reference for {q!r} failed: {got.status} {got.error} "
                               f"(degraded: {got.degraded}, build: {got.build_id})")
        ref[q] = got.units
        builds.add(got.build_id)
    if len(builds) != 1:
        raise RuntimeError(f"the fault-free reference was answered by several builds: {sorted(builds)}")
    return {builds.pop(): ref}


def references_problem(app: References, single: References) -> str | None:
    """Why the app's fault-free answers (:func:`reference_top_k`) are not those of a single index
    over the same build (exact search: the shards' merge is the whole index's top-k), or None."""
    for build, topk in app.items():
        if build not in single:
            return f"no single-index reference for build {build}"
        for q, units in topk.items():
            got = Outcome(status=200, ms=0.0, units=units, build_id=build)
            if why := top_k_problem(got, single[build][q]):
                return f"build {build}, {q!r}: the app's answer is not the single index's: {why}"
    return None


# ---------------------------------------------------------------------------- load


async def retrieve_load(client: httpx.AsyncClient, plan: ChaosPlan, n: int, *,
                        at: int | None = None, fault: Callable[[], Awaitable[Any]] | None = None,
                        ref: References | None = None, until: asyncio.Event | None = None) -> list[Outcome]:
    """``n`` ``/v1/retrieve`` requests, ``plan.concurrency`` at a time; ``fault()`` is awaited once
    ``at`` requests have been sent (the others keep going meanwhile). With ``until``, the requests go
    on past ``n`` until it is set (the caller sets it, e.g. once the fault is repaired: the load spans
    the whole outage, however fast the machine answers). With ``ref``, every 200 is checked against
    the fault-free top-k of its question from the build that answered it (``Outcome.wrong``; a build
    ``ref`` does not know is wrong too)."""
    outcomes: list[Outcome] = []
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while sent < n or (until is not None and not until.is_set()):
            i = sent
            sent += 1
            if fault is not None and i == at:
                await fault()
            q = plan.questions[i % len(plan.questions)]
            t0 = time.perf_counter()
            try:
                r = await client.post("/v1/retrieve", json={"question": q, "k": plan.k})
                got = Outcome.of(r, (time.perf_counter() - t0) * 1e3)
                if ref is not None and got.status == 200:
                    got.question = q
                    known = ref.get(got.build_id or "")
                    why = (top_k_problem(got, known[q]) if known is not None
                           else f"answered by build {got.build_id}, which no reference knows")
                    if why:
                        got.wrong, got.error = True, f"wrong top-k for {q!r}: {why}"
                outcomes.append(got)
            except httpx.HTTPError as exc:
                outcomes.append(Outcome(status=0, ms=(time.perf_counter() - t0) * 1e3,
                                        error=f"{type(exc).__name__}: {exc}"))

    await asyncio.gather(*(worker() for _ in range(plan.concurrency)))
    return outcomes


async def wait_recovered(client: httpx.AsyncClient, plan: ChaosPlan, t_kill: float) -> Recovery:
    """Poll /readyz until it is ok (every replica of every shard live) in a report built after the
    kill (/readyz is cached for serve.readyz_cache_s: an older report still shows the replica
    before it died), ``plan.report_lag_s`` after it at least; then retrieve until 4 in a row answer from
    every shard with every replica live, within ``plan.report_lag_s`` more (``full_coverage_after``):
    each Retriever replica counts a lost replica until its own health check reads the counts again,
    so with several Retrievers one may say "1 of 2" a little longer than /readyz."""
    deadline = t_kill + plan.recovery_timeout_s
    redundancy = ""
    while time.perf_counter() < deadline:
        try:
            r = await client.get("/readyz")
            body = readiness(r)
            redundancy = body.get("redundancy", "")
            fresh = time.perf_counter() - float(body.get("age_s", 0.0)) > t_kill + plan.report_lag_s
            if r.status_code == 200 and body.get("status") == "ok" and fresh:
                seconds = round(time.perf_counter() - t_kill, 1)
                until, streak = time.perf_counter() + plan.report_lag_s, 0
                while streak < 4 and time.perf_counter() < until:
                    check = (await retrieve_load(client, plan.model_copy(update={"concurrency": 1}), 1))[0]
                    full = check.status == 200 and not check.degraded and not check.redundancy_degraded
                    streak = streak + 1 if full else 0
                    await asyncio.sleep(0.1)
                return Recovery(recovered=True, seconds=seconds, redundancy=redundancy, full_coverage_after=streak >= 4)
        except (httpx.HTTPError, ValueError):
            pass
        await asyncio.sleep(0.5)
    return Recovery(recovered=False, seconds=round(time.perf_counter() - t_kill, 1), redundancy=redundancy)


# ---------------------------------------------------------------------------- verdicts


def _lost_or_wrong(load: LoadResult, exact: str) -> list[str]:
    """The problems every load under a fault may have: requests that failed, answers not ``exact``."""
    out = [f"{load.failed} of {load.requests} requests failed: {load.errors}"] if load.failed else []
    if load.wrong:
        out.append(f"{load.wrong} of {load.checked} answers were not {exact}: {load.errors}")
    return out


def judge_replica(res: ScenarioResult, plan: ChaosPlan) -> ScenarioResult:
    load, rec = res.load, res.recovery
    assert load is not None and rec is not None
    res.problems += _lost_or_wrong(load, "the exact top-k")
    if not (rec.recovered and rec.full_coverage_after):
        res.problems.append(f"the replica was not re-created in {plan.recovery_timeout_s:g} s ({rec.redundancy})")
    return res


def judge_shard(res: ScenarioResult, plan: ChaosPlan) -> ScenarioResult:
    load, rec = res.load, res.recovery
    assert load is not None and rec is not None
    if load.server_errors:
        res.problems.append(f"{load.server_errors} server errors (5xx or no response): {load.errors}")
    if load.wrong:
        res.problems.append(f"{load.wrong} of {load.checked} answers were not the exact top-k (or, degraded, its "
                            f"units on the shards that answered): {load.errors}")
    if load.degraded == 0 and load.failed:
        res.problems.append(f"no response was flagged degraded while shard {plan.shard} had no replica")
    # degraded == 0 and nothing failed: the requests waited for the shard's new replicas within the
    # stage deadline (Serve holds a call while a deployment has no running replica)
    if load.failed_shards and load.failed_shards != [plan.shard]:
        res.problems.append(f"responses named shards {load.failed_shards}, expected [{plan.shard}]")
    if not (rec.recovered and rec.full_coverage_after):
        res.problems.append(f"full coverage not back in {plan.recovery_timeout_s:g} s ({rec.redundancy})")
    return res


def judge_rollout(res: ScenarioResult) -> ScenarioResult:
    load, ro = res.load, res.rollout
    assert load is not None and ro is not None
    if ro.error:
        res.problems.append(f"the rollout stopped: {ro.error}")
    res.problems += _lost_or_wrong(load, "the exact top-k of the build that answered them")
    if load.degraded:
        res.problems.append(f"{load.degraded} responses were degraded during the rollout")
    published = [b for b, outcome in ro.race.items() if outcome == "published"]
    if len(ro.race) != 2 or len(published) != 1:
        res.problems.append(f"two racing publishers: exactly one must publish, got {ro.race}")
    elif not all("AliasConflict" in outcome for b, outcome in ro.race.items() if b != ro.winner):
        res.problems.append(f"the losing publisher did not get an AliasConflict: {ro.race}")
    if ro.winner is not None and set(load.builds) - {ro.parent, ro.winner}:
        res.problems.append(f"answered by builds {sorted(load.builds)}: only {ro.parent} and {ro.winner} "
                            "were published")
    if ro.winner is not None and not load.builds.get(ro.winner):
        res.problems.append(f"no request was answered by the published update {ro.winner}")
    if ro.rollback_s is None:
        res.problems.append("the app did not return to the parent build after the rollback")
    if ro.parent_kept is False:
        res.problems.append(f"the parent's application ({ro.parent}) was deleted by the retirement the rollback undid")
    if ro.winner is not None and ro.rollback_s is not None and ro.winner_deleted_s is None:
        res.problems.append(f"the rolled-back update's application ({ro.winner}) was not deleted after its retirement")
    if ro.loser_app:
        res.problems.append("the losing update got an application")
    if ro.differing == 0:
        res.problems.append("the parent and the winner rank every question alike: the check cannot tell which "
                            "build answered")
    return res


def judge_node(res: ScenarioResult, plan: ChaosPlan) -> ScenarioResult:
    load, rec = res.load, res.recovery
    assert load is not None and rec is not None
    if not any("#Retriever#" in name for name in res.killed):
        res.problems.append(f"the node killed held no Retriever replica: {res.killed}")
    res.problems += _lost_or_wrong(load, "the exact top-k (or, degraded, its units on the shards that answered)")
    if not (rec.recovered and rec.full_coverage_after):
        res.problems.append(f"full redundancy not back in {plan.recovery_timeout_s:g} s after the new node joined "
                            f"({rec.redundancy})")
    running, wanted = res.retrievers_after or (0, 0)
    if running < wanted or wanted == 0:
        res.problems.append(f"{running} of {wanted} Retriever replicas running after the recovery")
    return res


def judge_llm(res: ScenarioResult) -> ScenarioResult:
    a, nxt = res.answer, res.next_request
    if a is None or nxt is None:
        res.problems.append("the LLM scenario did not run")
        return res
    if not res.in_flight_at_kill:
        res.problems.append("the answer was not in flight when the LLM replica was killed")
    if a.status not in (200, 503) or (a.status == 503 and not a.json_error):
        res.problems.append(f"the answer in flight got {a.status} ({a.error}), expected a JSON 503 (or 200 after "
                            "the retry)")
    if a.status == 503 and "read" not in (a.error or ""):
        res.problems.append(f"the 503 does not name the read stage: {a.error}")
    if res.stream_error is None or res.stream_error.get("detail", {}).get("stage") != "read":
        res.problems.append(f"the started stream did not end with an error event naming the stage: "
                            f"{res.stream_events[-3:]} {res.stream_error}")
    if nxt.status != 200:
        res.problems.append(f"the next request got {nxt.status}: {nxt.error}")
    return res


def summarize(scenarios: list[ScenarioResult], plan: ChaosPlan, wall_s: float,
              load_avg: dict[str, list[float]], error: str | None = None) -> ChaosSummary:
    passed = error is None and len(scenarios) == 5 and all(s.passed for s in scenarios)
    return ChaosSummary(passed=passed, wall_s=round(wall_s, 1), plan=plan.model_dump(exclude={"questions"}),
                        load_avg=load_avg, scenarios=scenarios, error=error)
