"""``python -m jobs.bench serve`` end to end, tiny: the Serve app from cpu.yaml (retrieval in the
Ingress) and from cpu-cluster.yaml (separate deployments: the handles row too) over the sample build
with the real bundled models on a local Ray, a few /v1/retrieve calls at concurrency 1 and 2 and (cpu.yaml)
one chat completion, each beside the same work in process; the last stdout line is the JSON report."""

from __future__ import annotations

import json

import pytest

from lab.bench.cli.serve import QUESTIONS, ROOT, main

pytestmark = pytest.mark.ray("a")  # starts a local Ray (tests/conftest.py)

PORT = 8411


@pytest.mark.slow
@pytest.mark.scenario
@pytest.mark.parametrize("config", ["cpu.yaml", "cpu-cluster.yaml"])
def test_tiny_bench_ends_with_one_json_line_of_levels_and_overheads(config, sample_index, tmp_path, capfd):
    split = config == "cpu-cluster.yaml"
    chat = [] if split else ["--chat-levels", "1", "--chat-requests", "1", "--chat-k", "1", "--stream-requests", "1"]
    rc = main(["--index", sample_index["uri"], "--port", str(PORT), "--levels", "1,2", "--requests", "4",
               "--config", str(ROOT / "serve" / "configs" / config), *chat, *(["--skip-chat"] if split else ["--direct-ingress"]),
               "--out", str(tmp_path / "out"), "--log", str(tmp_path / "bench.log")])
    out = capfd.readouterr().out.strip().splitlines()
    assert rc == 0, out[-3:]
    report = json.loads(out[-1])
    assert report == json.loads((tmp_path / "out" / "bench_serve.json").read_text())
    assert report["bench"] == "serve" and report["machine"]["cpus"] >= 1 and len(report["machine"]["loadavg"]) == 3
    assert report["config"].endswith(config) and report["direct_ingress"] is not split  # make serve's way for cpu.yaml
    assert [row["concurrency"] for row in report["retrieve"]] == [1, 2]
    for row in report["retrieve"]:
        c = row["concurrency"]
        assert ("handles" in row) == split  # no QueryEncoder/Retriever handles when they are in the Ingress
        for side, name in (("http", "retrieve.http"), ("handles", "retrieve.handles"),
                           ("in_process", "retrieve.in_process"))[:: 1 if split else 2]:
            level = row[side]
            assert (level["name"], level["concurrency"], level["requests"], level["ok"], level["errors"]) == \
                (name, c, 4, 4, 0), level
            assert 0 < level["latency"]["p50_ms"] <= level["latency"]["p99_ms"] and level["throughput_rps"] > 0
        o = row["overhead"]
        assert o["p50_ms"] == round(row["http"]["latency"]["p50_ms"] - row["in_process"]["latency"]["p50_ms"], 2)
        assert o["p50_ratio"] > 0 and o["throughput_ratio"] > 0
        if split:
            assert row["overhead_handles"]["p50_ms"] == round(
                row["handles"]["latency"]["p50_ms"] - row["in_process"]["latency"]["p50_ms"], 2)
        trace = row["trace_p50_ms"]
        assert {"encode_ms", "retrieve_ms", "total_ms", "client_ms", "outside_ingress_ms"} <= set(trace)
        assert trace["client_ms"] >= trace["total_ms"] > 0
    assert set(report["summary"]["retrieve_throughput_ratio"]) == {"1", "2"}
    if split:
        assert "chat" not in report
        return
    (chat,) = report["chat"]
    assert chat["concurrency"] == 1 and chat["http"]["ok"] == 1 and chat["in_process"]["ok"] == 1
    assert chat["http"]["name"] == "chat.http" and chat["in_process"]["name"] == "reader.in_process"
    s = report["summary"]
    assert set(s["retrieve_overhead_p50_ms"]) == {"1", "2"} and s["retrieve_overhead_p50_ms_goal"] == 10.0
    assert isinstance(s["retrieve_overhead_goal_met"], bool) and isinstance(s["retrieve_throughput_grows"], bool)
    assert s["errors"] == 0 and set(s["chat_throughput_rps"]) == {"1"}
    stream = report["stream"]  # one streamed completion: its first token came before its end, both ways
    assert stream["requests"] == 1 and stream["errors"] == 0, stream
    assert 0 < stream["http_first_token_p50_ms"] < stream["http_total_p50_ms"], stream
    assert 0 < stream["in_process_first_token_p50_ms"] < stream["in_process_total_p50_ms"], stream
    assert s["stream_first_token_overhead_p50_ms"] == round(
        stream["http_first_token_p50_ms"] - stream["in_process_first_token_p50_ms"], 1)
    assert len(set(QUESTIONS)) == len(QUESTIONS)
