"""The chaos job's records and verdicts (``lab.chaos``), without an app: the figures of a run
and what makes a scenario fail. The job itself runs in ``tests/jobs/test_chaos.py``."""

from __future__ import annotations

import httpx

from lab.chaos import ChaosPlan, LoadResult, Outcome, Recovery, ScenarioResult, judge_replica, judge_shard, summarize


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
    unseen = LoadResult.of([Outcome.of(httpx.Response(200, json=_cov()), 1.0)])
    res = judge_replica(ScenarioResult(name="replica", killed=["x"], load=unseen, recovery=back), plan)
    assert res.problems == ["no response showed the lost replica (coverage.redundancy_degraded)"]
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
