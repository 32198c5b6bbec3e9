"""The long-document benchmark: documents from a question's paragraphs, settings, both readers' prompts,
the shared budget and resume (scripted LLM; the real models run in `jobs.bench reader --document`)."""

from __future__ import annotations

import asyncio

import pytest

from lab.document_bench import (
    DocumentSetting,
    parse_document_settings,
    question_document,
    run_document_settings,
)
from lab.reader_bench import PLAIN_USER
from lab.reader_report import summarize, versus_plain
from longrag.eval.datasets import Paragraph, QAExample
from longrag.mixpr.config import MixPRConfig
from tests.fakes import ScriptedLLM


def example(qid: str = "q1", n_distractors: int = 5) -> QAExample:
    paras = [Paragraph("Animal Farm", "Animal Farm is a novella by George Orwell.", True),
             Paragraph("George Orwell", "Orwell was born in Motihari in 1903.", True)]
    paras += [Paragraph(f"Distractor {i}", f"Filler paragraph number {i} says nothing useful.") for i in range(n_distractors)]
    return QAExample(qid=qid, question="Where was the author of Animal Farm born?", answers=["Motihari"],
                     gold_titles=["Animal Farm", "George Orwell"], supporting=[], type="bridge", paragraphs=paras)


def test_parse_document_settings():
    assert parse_document_settings("plain, mixpr/auto,sparse/local/k400,mixpr") == [
        DocumentSetting(), DocumentSetting("mixpr", "auto"), DocumentSetting("sparse", "local", 400),
        DocumentSetting("mixpr", "auto")]
    assert [s.label for s in parse_document_settings("plain,sparse/local/k400")] == ["plain", "sparse/local/k400"]
    for bad in ("", "dense/auto", "mixpr/sideways", "sparse/local/400", "sparse/local/k0", "mixpr/auto/k2/x"):
        with pytest.raises(ValueError):
            parse_document_settings(bad)


def test_document_holds_both_golds_and_the_asked_distractors_seeded():
    ex = example()
    doc = question_document(ex, 2, seed=0)
    blocks = doc.split("\n\n")
    assert len(blocks) == 4
    titles = [b.split("\n", 1)[0] for b in blocks]
    assert {"Animal Farm", "George Orwell"} <= set(titles)
    assert sum(t.startswith("Distractor") for t in titles) == 2
    assert question_document(ex, 2, seed=0) == doc  # deterministic
    assert any(question_document(ex, 2, seed=s) != doc for s in range(1, 6))  # the seed matters
    assert question_document(ex, 99).count("\n\n") == 6  # capped at what the question has
    with pytest.raises(ValueError, match="no supporting paragraph"):
        question_document(QAExample("q", "?", ["a"], [], [], "bridge", paragraphs=[Paragraph("t", "x")]), 2)


def test_plain_and_pipeline_read_the_same_document_and_resume(tmp_path):
    ex = example()
    ex.question = " " + ex.question + "  "  # as some HotpotQA questions come: both read it stripped
    # plain replies first for each question, then the pipeline's read (route local: no router call)
    llm = ScriptedLLM(["Motihari\nbecause Orwell was born there", "The answer is Motihari."], context_window=2048)
    settings = parse_document_settings("plain,sparse/local/k400")
    rows = asyncio.run(run_document_settings(llm, [ex], settings, mixpr=MixPRConfig(), distractors=2,
                                             checkpoint=tmp_path / "rows.jsonl"))
    assert [r["setting"] for r in rows] == ["plain", "sparse/local/k400"]
    plain_call, pipe_call = llm.calls
    doc = question_document(ex, 2)
    assert plain_call["messages"][1]["content"] == PLAIN_USER.format(context=doc, question=ex.question.strip())
    read = pipe_call["messages"][1]["content"]
    assert read == plain_call["messages"][1]["content"]  # every chunk kept: the bare prompt itself
    assert "born in Motihari" in read and "Reply with only the answer." in read
    assert rows[0]["answer"] == "Motihari" and rows[0]["em"] == 1.0  # first line kept
    assert rows[1]["answer"] == "Motihari" and rows[1]["em"] == 1.0  # the pipeline's short-answer cleaning
    assert rows[0]["budget"] == rows[1]["budget"] > 0 and not rows[0]["truncated"]
    summary = summarize(rows)
    assert versus_plain(summary) == {"sparse/local/k400": {"vs": "plain", "em": 0.0, "f1": 0.0}}
    # a rerun reads nothing
    again = ScriptedLLM([], context_window=2048)
    rows2 = asyncio.run(run_document_settings(again, [ex], settings, distractors=2, checkpoint=tmp_path / "rows.jsonl"))
    assert again.calls == [] and [r["answer"] for r in rows2] == ["Motihari", "Motihari"]


def test_plain_is_trimmed_to_the_pipelines_budget():
    ex = example(n_distractors=0)
    ex.paragraphs[0].text = " ".join(["word"] * 900)  # longer than the window leaves for passages
    llm = ScriptedLLM(["Motihari"], context_window=700)
    rows = asyncio.run(run_document_settings(llm, [ex], [DocumentSetting()], distractors=0))
    assert rows[0]["truncated"] and rows[0]["context_tokens"] <= rows[0]["budget"]


def test_every_call_is_read_cold():
    """Every LLM call of a row (the router's and the reader's too) runs with cold_reads on; the
    LLM's own setting is back afterwards."""
    class Recording(ScriptedLLM):
        async def chat(self, messages, **kw):
            seen.append(self.cold_reads)
            return await super().chat(messages, **kw)

    seen: list[bool] = []
    llm = Recording(["Motihari", "y", "Motihari"], context_window=2048)
    asyncio.run(run_document_settings(llm, [example()], parse_document_settings("plain,mixpr/auto"), distractors=2))
    assert len(llm.calls) == 3 and seen == [True, True, True] and llm.cold_reads is False
