"""Reader benchmark plan: settings parsing, shared reads, resume, summary (scripted LLM)."""

from __future__ import annotations

import asyncio
import json

import pytest

from lab.reader_bench import Candidates, ReaderSetting, parse_settings, run_settings
from lab.reader_report import attribution, markdown_table, summarize, versus_plain
from longrag.config import ReaderConfig
from longrag.eval.datasets import QAExample
from longrag.types import Unit
from tests.fakes import ScriptedLLM


def test_parse_settings():
    assert parse_settings("full@2048, mixpr@4096,full@2048/2t/fs8,plain@1024,mixpr@1536/2t") == [
        ReaderSetting("full", 2048), ReaderSetting("mixpr", 4096), ReaderSetting("full", 2048, 8, "two_turn"),
        ReaderSetting("plain", 1024), ReaderSetting("mixpr", 1536, 0, "two_turn")]
    assert [s.label for s in parse_settings("full@2048,mixpr@8192/2t/fs2,plain@1024,full@1536")] == [
        "full@2K", "mixpr@8K 2turn fs2", "plain@1K", "full@1.5K"]
    for bad in ("", "half@2048", "full@", "full@x", "full@2048/fsx", "full@0", "full@2048/fs8", "plain@1024/2t",
                "full@1024/3t"):
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
    settings = parse_settings("full@2048/2t,mixpr@2048/2t")
    rows = asyncio.run(run_settings(llm, EXAMPLES, SMALL, settings, checkpoint=tmp_path / "rows.jsonl"))
    assert len(llm.calls) == 4 and len(rows) == 4
    summary = {s["setting"]: s for s in summarize(rows)}
    assert summary["full@2K 2turn fs0"]["em"] == summary["mixpr@2K 2turn fs0"]["em"] == 100.0
    assert summary["full@2K 2turn fs0"]["questions"] == 2 and summary["full@2K 2turn fs0"]["fallbacks"] == 0
    # a rerun takes every row from the checkpoint and reads nothing
    again = ScriptedLLM()
    rows2 = asyncio.run(run_settings(again, EXAMPLES, SMALL, settings, checkpoint=tmp_path / "rows.jsonl"))
    assert again.calls == [] and [r["answer"] for r in rows2] == [r["answer"] for r in rows]
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 4


def test_other_few_shot_counts_are_separate_reads_and_scored():
    llm = ScriptedLLM(["Orwell wrote it.", "George Orwell", "Orwell wrote it.", "Eric Blair"])
    rows = asyncio.run(run_settings(llm, EXAMPLES[:1], SMALL, parse_settings("full@2048/2t/fs8,full@2048/2t")))
    assert len(llm.calls) == 4
    by = {r["setting"]: r for r in rows}
    assert by["full@2K 2turn fs8"]["f1"] == 1.0 and by["full@2K 2turn fs0"]["f1"] == 0.0
    # the few-shot count is what differs between the two second turns
    assert "Examples:" in llm.calls[1]["messages"][-1]["content"]
    assert "Examples:" not in llm.calls[3]["messages"][-1]["content"]
    json.dumps(rows)  # rows are plain JSON


def test_bench_cli_rejects_bad_values(capsys):
    from lab.bench.cli.reader import parse_args

    for argv in (["--dataset", "hotpotqa", "--settings", "half@2"], ["--dataset", "nq"],
                 ["--dataset", "musique", "--limit", "0"]):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "half@2" in err and "invalid choice: 'nq'" in err and "'0' is out of range" in err


def test_plain_is_one_bare_message_over_the_truncated_candidates_first_line_kept():
    """The baseline: system + user, the candidates as the truncating fit leaves them, the reply's
    first line as it came (no cleaning); the direct reader at the same budget reads the same text."""
    llm = ScriptedLLM(["The answer is George Orwell.\nHe wrote it in 1945.", "The answer is George Orwell."])
    rows = asyncio.run(run_settings(llm, EXAMPLES[:1], SMALL, parse_settings("plain@1024,full@1024"),
                                    base=ReaderConfig(long_answer=False)))
    by = {r["setting"]: r for r in rows}
    plain_msgs, direct_msgs = llm.calls[0]["messages"], llm.calls[1]["messages"]
    assert [m["role"] for m in plain_msgs] == ["system", "user"]
    assert plain_msgs[1]["content"].endswith("Question: Who wrote Animal Farm?\nReply with only the answer.")
    assert "Title: Animal Farm\nAnimal Farm is a novella by George Orwell." in plain_msgs[1]["content"]
    # the reads of a question share the system message and the documents (one KV prefix)
    docs_end = plain_msgs[1]["content"].index("Question:")
    assert plain_msgs[0] == direct_msgs[0] and plain_msgs[1]["content"][:docs_end] == direct_msgs[1]["content"][:docs_end]
    assert by["plain@1K"]["answer"] == "The answer is George Orwell."  # first line, as it came
    assert by["plain@1K"]["em"] == 0.0 and by["full@1K"]["answer"] == "George Orwell" and by["full@1K"]["em"] == 1.0
    summary = summarize(rows)
    assert versus_plain(summary) == {"full@1K": {"vs": "plain@1K", "em": 100.0, "f1": round(100 - 100 * 2 / 3, 1)}}


def test_attribution_scores_each_finishing_step_on_the_same_replies():
    golds = ["George Orwell"]
    base = {"question": "Who wrote Animal Farm?", "golds": golds, "setting": "s", "answer_mode": "two_turn"}
    rows = [
        # raw wrong, cleaned right
        base | {"raw_short_answer": "Answer: George Orwell.", "answer": "George Orwell", "fallback": None,
                "long_answer": "George Orwell wrote it."},
        # the guard replaced a question echo with the long answer's span: gained
        base | {"raw_short_answer": "Who wrote Animal Farm?", "answer": "George Orwell", "fallback": "question echo",
                "long_answer": "George Orwell wrote Animal Farm."},
    ]
    (row,) = attribution(rows)
    assert (row["raw_em"], row["cleaned_em"], row["final_em"]) == (0.0, 50.0, 100.0)
    assert row["replaced"] == 1 and (row["replaced_gained"], row["replaced_lost"]) == (1, 0)
    assert "long_em" in row


def test_summary_has_refined_em_the_gold_inside_a_short_answer():
    base = {"mode": "full", "budget": 1024, "few_shot": 0, "answer_mode": "direct", "seconds": 1.0, "long_s": 0.0,
            "short_s": 1.0, "prompt_tokens": 10, "context_tokens": 8, "fallback": None, "f1": 0.0}
    rows = [dict(base, setting="full@1K", answer="the city of Paris", golds=["Paris"], em=0.0),
            dict(base, setting="full@1K", answer="London", golds=["Paris"], em=0.0)]
    [s] = summarize(rows)
    assert s["em"] == 0.0 and s["refined_em"] == 50.0
    assert "| refined EM |" in markdown_table("hotpotqa", [s])
