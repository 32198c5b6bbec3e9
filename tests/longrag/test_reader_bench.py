"""Reader benchmark plan: settings parsing, shared reads, resume, summary (scripted LLM)."""

from __future__ import annotations

import asyncio
import json

import pytest

from longrag.eval.datasets import QAExample
from longrag.eval.reader_bench import Candidates, ReaderSetting, parse_settings, run_settings, summarize
from longrag.types import Unit
from tests.fakes import ScriptedLLM


def test_parse_settings():
    assert parse_settings("full@2048, mixpr@4096,full@2048/fs8") == [
        ReaderSetting("full", 2048), ReaderSetting("mixpr", 4096), ReaderSetting("full", 2048, 8)]
    assert [s.label for s in parse_settings("full@2048,mixpr@8192/fs2")] == ["full@2K fs0", "mixpr@8K fs2"]
    for bad in ("", "half@2048", "full@", "full@x", "full@2048/fsx", "full@0"):
        with pytest.raises(ValueError):
            parse_settings(bad)


def example(qid: str, question: str, answer: str) -> QAExample:
    return QAExample(qid=qid, question=question, answers=[answer], gold_titles=[], supporting=[], type="bridge")


EXAMPLES = [example("q1", "Who wrote Animal Farm?", "George Orwell"),
            example("q2", "What is the capital of Angola?", "Luanda")]
SMALL = Candidates({
    "q1": [Unit("u1", ["d1"], ["Animal Farm"], "Animal Farm is a novella by George Orwell.", 8)],
    "q2": [Unit("u2", ["d2"], ["Angola"], "Luanda is the capital of Angola.", 6)],
})


def test_settings_with_the_same_context_share_one_read(tmp_path):
    # Both units fit any budget whole: full and mixpr give the model the same context, so each
    # question is read once for the two settings (2 turns = 2 calls per read).
    llm = ScriptedLLM(["Orwell wrote it.", "George Orwell", "Luanda is the capital.", "Luanda"])
    settings = parse_settings("full@2048,mixpr@2048")
    rows = asyncio.run(run_settings(llm, EXAMPLES, SMALL, settings, checkpoint=tmp_path / "rows.jsonl"))
    assert len(llm.calls) == 4 and len(rows) == 4
    summary = {s["setting"]: s for s in summarize(rows)}
    assert summary["full@2K fs0"]["em"] == summary["mixpr@2K fs0"]["em"] == 100.0
    assert summary["full@2K fs0"]["questions"] == 2 and summary["full@2K fs0"]["fallbacks"] == 0
    # a rerun takes every row from the checkpoint and reads nothing
    again = ScriptedLLM()
    rows2 = asyncio.run(run_settings(again, EXAMPLES, SMALL, settings, checkpoint=tmp_path / "rows.jsonl"))
    assert again.calls == [] and [r["answer"] for r in rows2] == [r["answer"] for r in rows]
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 4


def test_other_few_shot_counts_are_separate_reads_and_scored():
    llm = ScriptedLLM(["Orwell wrote it.", "George Orwell", "Orwell wrote it.", "Eric Blair"])
    rows = asyncio.run(run_settings(llm, EXAMPLES[:1], SMALL, parse_settings("full@2048/fs8,full@2048")))
    assert len(llm.calls) == 4
    by = {r["setting"]: r for r in rows}
    assert by["full@2K fs8"]["f1"] == 1.0 and by["full@2K fs0"]["f1"] == 0.0
    # the few-shot count is what differs between the two second turns
    assert "Examples:" in llm.calls[1]["messages"][-1]["content"]
    assert "Examples:" not in llm.calls[3]["messages"][-1]["content"]
    json.dumps(rows)  # rows are plain JSON


def test_bench_cli_rejects_bad_values(capsys):
    from jobs.bench_reader import parse_args

    for argv in (["--dataset", "hotpotqa", "--settings", "half@2"], ["--dataset", "nq"],
                 ["--dataset", "musique", "--limit", "0"]):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "half@2" in err and "invalid choice: 'nq'" in err and "'0' is out of range" in err
