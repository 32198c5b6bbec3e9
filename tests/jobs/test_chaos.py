"""``python -m jobs.chaos`` for real, reduced (at least 100 requests instead of 1,000: the load goes on
until the killed replica is back anyway): the bundled sample
index, the bundled encoder and SmolLM2 reader, shard replicas and the LLM replica killed from
outside while the app answers, two updates published at once and the alias rolled back, then the
node of a Retriever killed on a simulated two-node Ray; the figures come from the job's one JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray("a")  # starts a local Ray (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
PORT = 8403


@pytest.mark.slow
@pytest.mark.scenario
def test_reduced_chaos_run_meets_every_expectation(sample_index, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.chaos", "--index", sample_index["uri"], "--requests", "100",
         "--shard-requests", "40", "--port", str(PORT), "--log", str(tmp_path / "chaos.log"),
         "--recovery-timeout-s", "180", "--work", str(tmp_path / "work")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, (proc.returncode, proc.stderr[-3000:])
    summary = json.loads(lines[-1])  # the job ends with one JSON line
    log_tail = (tmp_path / "chaos.log").read_text()[-3000:]
    assert summary["job"] == "chaos" and summary["error"] is None, (summary, log_tail)
    by_name = {s["name"]: s for s in summary["scenarios"]}
    assert list(by_name) == ["replica", "shard", "llm", "rollout", "node"]

    replica = by_name["replica"]
    assert replica["load"]["requests"] >= 100 and replica["load"]["failed"] == 0, replica
    # the responses that saw "1 of 2" are counted, not required: with the shard cache warm Serve can
    # replace the replica before the counts are read again (lab.chaos)
    assert len(replica["killed"]) == 1, replica
    assert replica["load"]["degraded"] == 0, replica
    # exact search: every answer is the top-k asked before the faults (0 wrong answers)
    assert replica["load"]["checked"] == replica["load"]["requests"] and replica["load"]["wrong"] == 0, replica
    assert replica["recovery"]["recovered"] and replica["recovery"]["full_coverage_after"], replica

    shard = by_name["shard"]
    assert shard["load"]["requests"] == 40 and shard["load"]["server_errors"] == 0, shard
    # both replicas of shard 0 killed: Serve holds the calls until its new replicas run; a call that
    # waited past the stage deadline is answered without the shard, which is named
    load = shard["load"]
    assert (load["degraded"] > 0 and load["failed_shards"] == [0]) or (load["degraded"] == load["failed"] == 0), shard
    assert load["checked"] == load["ok"] and load["wrong"] == 0, shard
    assert shard["recovery"]["recovered"] and shard["recovery"]["full_coverage_after"], shard

    llm = by_name["llm"]
    assert llm["in_flight_at_kill"] and llm["answer"]["status"] in (200, 503), llm
    # a 200 only through the ingress's one retry (it reached Serve's replacement replica), else a JSON 503
    assert (llm["answer"]["status"] == 200 and llm["answer"]["retries"] == 1) or llm["answer"]["json_error"], llm
    assert llm["stream_error"]["detail"]["stage"] == "read", llm
    assert llm["next_request"]["status"] == 200, llm

    rollout = by_name["rollout"]
    ro, load = rollout["rollout"], rollout["load"]
    assert ro["error"] is None and ro["differing"] > 0, rollout  # the updates change some answers
    # two publishers raced from the same build: exactly one published, the other was refused
    assert sorted(v.split(":")[0] for v in ro["race"].values()) == ["AliasConflict", "published"], ro
    # every request answered, each by the parent or the published update and with its exact top-k
    # (a single in-process index over that build)
    assert load["failed"] == 0 and load["degraded"] == 0 and load["wrong"] == 0, rollout
    assert set(load["builds"]) == {ro["parent"], ro["winner"]} and load["checked"] == load["requests"], rollout
    # rolled back within retire_after_s: the parent's application outlived its retirement, the
    # update's was deleted by its own, the loser never had one
    assert ro["parent_kept"] is True and ro["winner_deleted_s"] is not None and ro["loser_app"] is False, ro

    node = by_name["node"]
    load = node["load"]
    # the worker node holding a Retriever replica died (its shard replicas with it): 0 lost requests,
    # every answer exact (degraded only with the shard named), then full redundancy on the new node
    assert any("#Retriever#" in name for name in node["killed"]), node
    assert load["failed"] == 0 and load["wrong"] == 0 and load["checked"] == load["requests"], node
    assert node["recovery"]["recovered"] and node["recovery"]["full_coverage_after"], node
    assert node["retrievers_after"] == [2, 2], node
    assert summary["passed"] is True and proc.returncode == 0, summary
