"""``jobs.bench llm``'s options, prompts and per-level arithmetic (the real backends run in `make bench-llm`)."""

from __future__ import annotations

import asyncio

import pytest

from lab.bench.cli.llm import bench, level_sizes, parse_args, prompts
from tests.fakes import ScriptedLLM


def test_options_are_checked(capsys):
    args = parse_args(["--backends", "vllm", "--concurrency", "1,8"])
    assert args.backends == ["vllm"] and args.concurrency == [1, 8]
    for argv, fragment in [
        (["--backends", "llamacpp,tgi"], "['tgi']: expected some of ['llamacpp', 'vllm']"),
        (["--concurrency", "1,x"], "expected integers like 1,4,16"),
        (["--concurrency", "0,4"], "levels must be >= 1"),
        (["--requests", "0"], "--requests"),
    ]:
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert fragment in capsys.readouterr().err, argv


def test_prompts_are_reader_shaped_and_distinct():
    ps = prompts(5)
    assert len(ps) == 5 and len({p[1]["content"] for p in ps}) == 5
    assert [m["role"] for m in ps[0]] == ["system", "user"]
    assert "Context:" in ps[0][1]["content"] and "Question:" in ps[0][1]["content"]


def test_each_level_reads_prompts_of_its_own():
    assert level_sizes([1, 4, 16], 8) == [8, 8, 16]
    requests = prompts(sum(level_sizes([1, 4], 2)) + 1)  # 2 + 4 + the warm-up
    llm = ScriptedLLM(default="one two three")
    rows = asyncio.run(bench(llm, requests, [1, 4], 3, lambda _: None, 2))
    assert [(r["concurrency"], r["requests"], r["completion_tokens"]) for r in rows] == [(1, 2, 6), (4, 4, 12)]
    sent = [c["messages"][1]["content"] for c in llm.calls]
    assert sent[0] == requests[-1][1]["content"]  # the warm-up
    assert len(set(sent)) == len(sent) == 7  # no prompt twice: nothing for a prefix cache to find
    for r in rows:
        assert r["p50_ms"] <= r["p99_ms"] and r["req_per_s"] > 0


def test_phase_settings_name_llama_cpp_python_default_and_the_products(monkeypatch):
    """``--phases default,held,3``: llama-cpp-python's own cpu_count() // 2, the CPUs the product
    gives llama.cpp (every usable one in a driver), or a number."""
    import os

    from lab.bench.cli.llm import thread_setting

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert [thread_setting(s) for s in ("default", "held", "3")] == [1, 2, 3]
    assert parse_args(["--phases", "default,held"]).phases == "default,held"
