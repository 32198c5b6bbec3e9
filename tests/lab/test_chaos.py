"""The chaos job's records and verdicts (``lab.chaos``), without an app: the figures of a run
and what makes a scenario fail. The job itself runs in ``tests/jobs/test_chaos.py``."""

from __future__ import annotations

import httpx

from lab.chaos import (
    ChaosPlan,
    LoadResult,
    Outcome,
    Recovery,
    Rollout,
    ScenarioResult,
    judge_replica,
    judge_rollout,
    judge_shard,
    references_problem,
    summarize,
    top_k_problem,
)


def _cov(degraded=False, lost=False, failed=(), failovers=0):
    replicas = [{"shard": 0, "live": 1 if lost else 2, "replicas": 2}, {"shard": 1, "live": 2, "replicas": 2}]
    return {"coverage": {"degraded": degraded, "redundancy_degraded": lost, "failed_shards": list(failed),
                         "failovers": failovers, "replicas": replicas}}


def test_outcomes_read_the_coverage_and_the_error_shape():
    ok = Outcome.of(httpx.Response(200, json=_cov(lost=True, failovers=1)), 12.0)
    assert (ok.status, ok.redundancy_degraded, ok.failovers, ok.error) == (200, True, 1, None)
    shaped = Outcome.of(httpx.Response(503, json={"error": {"code": "unavailable", "message": "the read stage failed",
                                                            "detail": {"stage": "read"}}}), 5.0)
    assert shaped.json_error and shaped.error == "unavailable: the read stage failed"
    plain = Outcome.of(httpx.Response(500, text="Internal Server Error"), 5.0)
    assert not plain.json_error and plain.error == "Internal Server Error"


def test_load_figures_count_failures_and_degraded_responses():
    outcomes = [Outcome.of(httpx.Response(200, json=_cov()), 10.0) for _ in range(6)]
    outcomes += [Outcome.of(httpx.Response(200, json=_cov(degraded=True, failed=[1])), 20.0)]
    outcomes += [Outcome(status=0, ms=30.0, error="ConnectError: refused")]
    load = LoadResult.of(outcomes)
    assert (load.requests, load.ok, load.failed, load.server_errors, load.degraded) == (8, 7, 1, 1, 1)
    assert load.failed_shards == [1] and load.p50_ms == 10.0 and load.errors == ["ConnectError: refused"]


def test_verdicts_name_what_was_not_met():
    plan = ChaosPlan(shard=1)
    good = LoadResult.of([Outcome.of(httpx.Response(200, json=_cov(lost=True)), 1.0)])
    back = Recovery(recovered=True, seconds=4.0, redundancy="", full_coverage_after=True)
    assert judge_replica(ScenarioResult(name="replica", killed=["x"], load=good, recovery=back), plan).passed
    # a replica replaced before any read of the counts fell in the gap: nobody saw it, nothing lost
    unseen = LoadResult.of([Outcome.of(httpx.Response(200, json=_cov()), 1.0)])
    assert judge_replica(ScenarioResult(name="replica", killed=["x"], load=unseen, recovery=back), plan).passed
    failed = LoadResult.of([Outcome.of(httpx.Response(200, json=_cov()), 1.0), Outcome(status=0, ms=1.0, error="x")])
    res = judge_replica(ScenarioResult(name="replica", killed=["x"], load=failed, recovery=back), plan)
    assert res.problems == ["1 of 2 requests failed: ['x']"]
    five = LoadResult.of([Outcome.of(httpx.Response(200, json=_cov(degraded=True, failed=[1])), 1.0),
                          Outcome.of(httpx.Response(502, text="bad gateway"), 1.0)])
    res = judge_shard(ScenarioResult(name="shard", killed=["a", "b"], load=five, recovery=back), plan)
    assert res.problems == ["1 server errors (5xx or no response): ['bad gateway']"]
    # the Serve shard tier holds the calls until the shard's new replicas run: nothing degraded, nothing failed
    waited = LoadResult.of([Outcome.of(httpx.Response(200, json=_cov(lost=True)), 900.0) for _ in range(3)])
    assert judge_shard(ScenarioResult(name="shard", killed=["a", "b"], load=waited, recovery=back), plan).passed
    lost = LoadResult.of([Outcome.of(httpx.Response(200, json=_cov()), 1.0), Outcome(status=0, ms=1.0, error="x")])
    res2 = judge_shard(ScenarioResult(name="shard", killed=["a", "b"], load=lost, recovery=back), plan)
    assert "no response was flagged degraded while shard 1 had no replica" in res2.problems
    summary = summarize([res], plan, 1.0, {})
    assert summary.passed is False and summary.line().startswith('{"job":"chaos","passed":false')


REF = [("u1", 0, 0.90), ("u2", 1, 0.80), ("u3", 0, 0.70), ("u4", 1, 0.60)]


def _got(units, degraded=False, failed=(), build="A"):
    body = _cov(degraded=degraded, failed=failed)
    body["units"] = [{"unit_id": u, "shard": s, "score": x} for u, s, x in units]
    body["trace"] = {"retrieve.build_id": build}
    return Outcome.of(httpx.Response(200, json=body), 1.0)


def test_exact_top_k_is_the_fault_free_one_or_its_live_shards_part():
    assert _got(REF).units == REF and top_k_problem(_got(REF), REF) is None
    assert top_k_problem(_got([REF[1], REF[0], *REF[2:]]), REF) == "rank 1: u2 (0.8000), expected u1 (0.9000)"
    assert top_k_problem(_got(REF[:3]), REF) == "3 units, expected 4"
    tie = [("u1", 0, 0.9), ("u2", 1, 0.8), ("u3", 0, 0.7), ("u4", 1, 0.7)]
    assert top_k_problem(_got([tie[0], tie[1], tie[3], tie[2]]), tie) is None  # a tie may trade places
    # shard 1 down: shard 0's units of the reference open the list, then more of shard 0
    live = [("u1", 0, 0.90), ("u3", 0, 0.70), ("u5", 0, 0.50), ("u6", 0, 0.40)]
    assert top_k_problem(_got(live, degraded=True, failed=[1]), REF) is None
    assert top_k_problem(_got([live[1], live[0], *live[2:]], degraded=True, failed=[1]), REF).startswith("rank 1")
    assert top_k_problem(_got(REF, degraded=True, failed=[1]), REF) == "a unit from a failed shard [1]"


def test_a_wrong_top_k_fails_the_scenario():
    plan = ChaosPlan(shard=0)
    back = Recovery(recovered=True, seconds=4.0, redundancy="", full_coverage_after=True)
    bad = _got([REF[1], REF[0], *REF[2:]]).model_copy(update={"question": "q", "wrong": True, "redundancy_degraded": True,
                                                              "error": "wrong top-k for 'q': rank 1"})
    good = _got(REF).model_copy(update={"question": "q"})
    load = LoadResult.of([good, bad])
    assert (load.checked, load.wrong, load.failed) == (2, 1, 0)
    res = judge_replica(ScenarioResult(name="replica", killed=["x"], load=load, recovery=back), plan)
    assert res.problems == ["1 of 2 answers were not the exact top-k: [\"wrong top-k for 'q': rank 1\"]"]


def _retrieve_app(slow_s: float = 0.005):
    import asyncio

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(slow_s)
        return httpx.Response(200, json={"units": [], **_cov()})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://chaos.test")


def test_the_load_spans_the_outage_when_told_to_wait_for_the_repair():
    """A fast machine answers the requests before the replica's loss is seen: with ``until`` the load
    goes on past ``n`` until the repair (here 0.3 s after the fault), then stops; without, exactly ``n``."""
    import asyncio
    import time

    from lab.chaos import retrieve_load

    plan = ChaosPlan(concurrency=4, questions=("q",))

    async def run(with_until: bool) -> tuple[int, float, float]:
        back = asyncio.Event()
        fired: list[float] = []

        async def fault() -> None:
            fired.append(time.perf_counter())
            asyncio.get_running_loop().call_later(0.3, back.set)

        async with _retrieve_app() as client:
            out = await retrieve_load(client, plan, 20, at=2, fault=fault, until=back if with_until else None)
        return len(out), fired[0], time.perf_counter()

    n, fired, end = asyncio.run(run(True))
    assert n > 20 and end - fired >= 0.3
    n, _, _ = asyncio.run(run(False))
    assert n == 20


def test_the_app_s_reference_must_be_the_single_index_s():
    single = {"A": {"q": REF}}
    assert references_problem({"A": {"q": REF}}, single) is None
    swapped = [REF[1], REF[0], *REF[2:]]
    assert "the app's answer is not the single index's: rank 1" in references_problem({"A": {"q": swapped}}, single)
    assert references_problem({"B": {"q": REF}}, single) == "no single-index reference for build B"


def _rollout_result(outcomes, **timeline):
    ro = Rollout(parent="A", race={"B": "published", "C": "AliasConflict: ... now serves B"}, winner="B",
                 switch_s=3.0, rollback_s=2.0, parent_kept=True, winner_deleted_s=21.0, loser_app=False,
                 differing=2)
    return judge_rollout(ScenarioResult(name="rollout", killed=[], load=LoadResult.of(outcomes),
                                        rollout=ro.model_copy(update=timeline)))


def test_a_rollout_passes_only_with_one_publisher_the_parent_kept_and_each_answer_its_build_s():
    answers = [_got(REF, build="A"), _got(REF[:1] + REF[2:] + [("u9", 1, 0.5)], build="B"), _got(REF, build="A")]
    res = _rollout_result(answers)
    assert res.passed and res.load.builds == {"A": 2, "B": 1}, res.problems
    assert "two racing publishers: exactly one must publish" in _rollout_result(
        answers, race={"B": "published", "C": "published"}).problems[0]
    assert _rollout_result(answers, parent_kept=False).problems == [
        "the parent's application (A) was deleted by the retirement the rollback undid"]
    assert _rollout_result(answers, winner_deleted_s=None).problems == [
        "the rolled-back update's application (B) was not deleted after its retirement"]
    stray = _rollout_result(answers + [_got(REF, build="C")])
    assert stray.problems == ["answered by builds ['A', 'B', 'C']: only A and B were published"]
    assert "the check cannot tell which build answered" in _rollout_result(answers, differing=0).problems[0]
    never = _rollout_result([_got(REF, build="A")])
    assert never.problems == ["no request was answered by the published update B"]


def test_each_answer_is_checked_against_the_build_that_answered_it():
    """A response from build B is held to B's top-k, not A's; a build without a reference is wrong."""
    import asyncio

    from lab.chaos import retrieve_load

    b_units = [("u9", 0, 0.95), *REF[1:]]
    answers = iter([("A", REF), ("B", b_units), ("B", REF), ("C", REF)])

    async def handler(request: httpx.Request) -> httpx.Response:
        build, units = next(answers)
        body = {**_cov(), "units": [{"unit_id": u, "shard": s, "score": x} for u, s, x in units],
                "trace": {"retrieve.build_id": build}}
        return httpx.Response(200, json=body)

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://chaos.test") as client:
            return await retrieve_load(client, ChaosPlan(concurrency=1, questions=("q",)), 4,
                                       ref={"A": {"q": REF}, "B": {"q": b_units}})

    out = asyncio.run(run())
    assert [o.wrong for o in out] == [False, False, True, True]
    assert "rank 1: u1" in out[2].error and "answered by build C, which no reference knows" in out[3].error


def test_a_node_loss_passes_with_no_lost_request_a_retriever_among_the_dead_and_both_retrievers_back():
    from lab.chaos import judge_node

    plan = ChaosPlan()
    back = Recovery(recovered=True, seconds=24.0, redundancy="", full_coverage_after=True)
    killed = ["SERVE_REPLICA::longrag#Retriever#ab", "SERVE_REPLICA::index-x#shard-0#cd"]
    load = LoadResult.of([_got(REF), _got(REF[:1] + REF[2:], degraded=True, failed=[1])])

    def judge(**update):
        res = ScenarioResult(name="node", killed=killed, load=load, recovery=back, retrievers_after=(2, 2))
        return judge_node(res.model_copy(update=update), plan).problems

    assert judge() == []
    assert judge(killed=killed[1:]) == [f"the node killed held no Retriever replica: {killed[1:]}"]
    assert judge(retrievers_after=(1, 2)) == ["1 of 2 Retriever replicas running after the recovery"]
    lost = LoadResult.of([_got(REF), Outcome(status=0, ms=1.0, error="ConnectError: refused")])
    assert judge(load=lost) == ["1 of 2 requests failed: ['ConnectError: refused']"]
