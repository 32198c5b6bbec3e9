"""LRGinstruction build with a fake teacher: each data kind's format, the self-evaluation filter,
teacher errors, resume after a crash (Zhao et al., 2024, Section 3.2 and Appendix C)."""

from __future__ import annotations

import json

import pytest

from longrag.dual.prompts import COT_PROMPT, EXTRACTOR_PROMPT, GENERATOR_PROMPT, JUDGE_PROMPT, SYSTEM, parse_judgement
from longrag.eval.datasets import LoadResult, Paragraph, QAExample
from longrag.llm.base import LLMError
from longrag.lrg import prompts as P
from longrag.lrg.build import JOURNAL, Input, build_lrg, read_records, split_of
from longrag.lrg.calls import Journal, llm_executor
from longrag.lrg.records import LRGConfig
from longrag.lrg.teacher import parse_teacher
from tests.fakes import ScriptedLLM

LONG = " ".join(["fact"] * 30)  # passes the 20-token rule


def count(text: str) -> int:
    return len(text.split())


def qa(i: int, n_dis: int = 6) -> QAExample:
    paras = [Paragraph(f"Sup{i}-{j}", f"supporting text {j} of question {i} " + "x " * 40, True) for j in range(2)]
    paras += [Paragraph(f"Dis{i}-{j}", f"distracting text {j} of question {i} " + "y " * 40, False) for j in range(n_dis)]
    return QAExample(f"id{i}", f"Question number {i}?", [f"Answer {i}"], [], [], "bridge", paragraphs=paras)


def loaded(n: int = 6, **kw) -> LoadResult:
    exs = [qa(i, **kw) for i in range(n)]
    return LoadResult("train.json", "hotpotqa", exs, n, 0)


CFG = LRGConfig(min_context_tokens={}, heldout_fraction=0.0)


def teacher_reply(verdict=lambda msgs: '{"status": true}', output=lambda msgs: LONG):
    def reply(msgs):
        user = msgs[-1]["content"]
        return verdict(msgs) if "Reply with JSON only" in user else output(msgs)

    return reply


def fake_teacher(reply=None) -> ScriptedLLM:
    llm = ScriptedLLM(context_window=100_000, name="fake-teacher")
    llm.default = reply or teacher_reply()
    return llm


def build(tmp_path, llm, cfg=CFG, n=6, **kw):
    return build_lrg([Input(loaded(n, **kw))], tmp_path, cfg, llm_executor(llm, concurrency=2), teacher="fake-teacher",
                     count_tokens=count)


def by_kind(tmp_path, split="train"):
    out: dict[str, list] = {}
    for r in read_records(tmp_path / f"{split}.jsonl"):
        out.setdefault(r.kind, []).append(r)
    return out


def test_four_kinds_have_the_pipeline_prompts_and_gold_outputs(tmp_path):
    report = build(tmp_path, fake_teacher())
    recs = by_kind(tmp_path)
    assert {k: len(v) for k, v in recs.items()} == {"extractor": 6, "cot": 6, "filter": 24, "task": 6}
    for r in recs["extractor"] + recs["cot"] + recs["filter"] + recs["task"]:
        assert [m.role for m in r.messages] == ["system", "user", "assistant"]
        assert r.messages[0].content == SYSTEM
        assert r.provenance.prompts_sha == P.PROMPTS_SHA and r.provenance.source == "train"
    ex = recs["extractor"][0]
    q = ex.provenance.question_id
    i = int(q.removeprefix("id"))
    # the instruction holds all of P (supporting + sampled distractors), as the pipeline's extractor prompt
    assert ex.messages[1].content.startswith("Background:\n")
    assert ex.messages[1].content.endswith(EXTRACTOR_PROMPT.split("{content}")[1].format(question=f"Question number {i}?"))
    assert ex.messages[1].content.count("supporting text") == 2 and ex.messages[1].content.count("distracting text") == 2
    assert ex.messages[2].content == LONG and ex.provenance.teacher == "fake-teacher"
    assert ex.provenance.self_evaluation == '{"status": true}'
    cot = recs["cot"][0]
    assert cot.messages[1].content.endswith(COT_PROMPT.split("{content}")[1].format(question=f"Question number {i}?"))
    # filtering data: one paragraph + question + the accepted CoT -> the support label as the pipeline's JSON
    for f in recs["filter"]:
        title = f.provenance.paragraph_titles[0]
        assert parse_judgement(f.messages[2].content) is title.startswith("Sup")
        assert json.loads(f.messages[2].content) == {"status": title.startswith("Sup")}
        assert f.messages[1].content.startswith("Passage:\n" + title)
        assert "Reasoning about the question: " + LONG in f.messages[1].content
    golds = [json.loads(f.messages[2].content)["status"] for f in recs["filter"]]
    assert golds.count(True) == golds.count(False) == 12  # balanced (Appendix C.3)
    task = recs["task"][0]
    i = int(task.provenance.question_id.removeprefix("id"))
    assert task.messages[2].content == f"Answer {i}" and task.provenance.teacher is None
    assert task.messages[1].content.endswith(GENERATOR_PROMPT.split("{content}")[1].format(question=f"Question number {i}?"))
    assert JUDGE_PROMPT.split("{content}")[0] == "Passage:\n"
    assert report.records == {"train": 42, "heldout": 0} and report.kept_ratio == 1.0
    assert report.paragraphs == {"supporting": 12, "distracting": 12}


def test_self_evaluation_rejects_and_the_filter_data_follows_the_cot(tmp_path):
    def verdict(msgs):
        user = msgs[-1]["content"]
        if "Question number 1?" in user and "explains the answer" in user:
            return '{"status": false}'  # CoT of q1 rejected
        if "Question number 2?" in user and "derived solely" in user:
            return "I cannot tell"  # extractor verdict of q2 unparseable
        return '{"status": true}'

    def output(msgs):
        return "too short" if "Question number 3?" in msgs[-1]["content"] else LONG

    llm = fake_teacher(teacher_reply(verdict, output))
    report = build(tmp_path, llm)
    ids = {(r.kind, r.provenance.question_id) for r in read_records(tmp_path / "train.jsonl")}
    assert ("cot", "id1") not in ids and ("filter", "id1") not in ids and ("extractor", "id1") in ids
    assert ("extractor", "id2") not in ids and ("cot", "id2") in ids
    assert not any(q == "id3" and k != "task" for k, q in ids)
    k = report.kinds
    assert k["extractor"].rejected == {"self-evaluation reply unparseable": 1, "output shorter than 20 tokens": 1}
    assert k["cot"].rejected == {"self-evaluation: false": 1, "output shorter than 20 tokens": 1}
    assert k["filter"].rejected == {"no accepted guiding CoT (self-evaluation: false)": 4,
                                    "no accepted guiding CoT (output shorter than 20 tokens)": 4}
    assert (k["extractor"].kept, k["cot"].kept, k["filter"].kept, k["task"].kept) == (4, 4, 16, 6)
    assert report.kept_ratio == pytest.approx(8 / 12, abs=1e-4)
    # short outputs never reach the self-evaluator: 12 generations + 10 verdicts
    assert len(llm.calls) == 22 and report.teacher_requests == 22
    rejected = [json.loads(line) for line in (tmp_path / "rejected.jsonl").read_text().splitlines()]
    assert len(rejected) == 12 and all(r["status"] == "rejected" for r in rejected)


def test_teacher_errors_are_counted_not_dropped(tmp_path):
    class Flaky(ScriptedLLM):
        async def chat(self, messages, **kw):
            if "Question number 4?" in messages[-1]["content"]:
                raise LLMError("HTTP 503: overloaded (after 3 attempts)")
            return await super().chat(messages, **kw)

    llm = Flaky(context_window=100_000, name="flaky")
    llm.default = teacher_reply()
    report = build(tmp_path, llm)
    assert report.teacher_errors == 2
    assert all("overloaded" in e for e in report.teacher_error_examples)
    assert report.kinds["extractor"].errors == 1 and report.kinds["cot"].errors == 1 and report.kinds["filter"].errors == 4
    assert report.kinds["extractor"].kept == 5
    # a rerun retries the failed calls (errors are journaled but never reused)
    report2 = build(tmp_path, fake_teacher())
    assert report2.teacher_errors == 0 and report2.kinds["extractor"].kept == 6
    assert report2.teacher_replies_reused == report2.teacher_requests - 4


def test_resume_after_a_crash_sends_only_the_missing_calls(tmp_path):
    ref = tmp_path / "ref"
    build(ref, fake_teacher())
    reference = (ref / "train.jsonl").read_text()

    class Crash(Exception):
        pass

    out = tmp_path / "out"
    llm = fake_teacher()
    inner = llm_executor(llm, concurrency=1)

    def crashing(requests, sink):
        n = 0

        def counting_sink(reply):
            nonlocal n
            if n == 7:
                raise Crash("killed mid-run")
            sink(reply)
            n += 1

        inner(requests, counting_sink)

    with pytest.raises(Crash):
        build_lrg([Input(loaded(6))], out, CFG, crashing, teacher="fake-teacher", count_tokens=count)
    assert not (out / "train.jsonl").exists()
    assert len((out / JOURNAL).read_text().splitlines()) == 7
    with open(out / JOURNAL, "a") as fh:
        fh.write('{"id": "torn')  # a line cut by the crash

    llm2 = fake_teacher()
    report = build(out, llm2)
    assert report.teacher_replies_reused == 7
    assert len(llm2.calls) == 24 - 7  # 12 generations + 12 verdicts, 7 of them done before the crash
    assert (out / "train.jsonl").read_text() == reference
    lines = (out / JOURNAL).read_text().splitlines()
    assert len(lines) == 24 and Journal(out / JOURNAL).bad_lines == 0  # the torn line was cut off
    # a third run has nothing left to ask
    llm3 = fake_teacher()
    assert build(out, llm3).teacher_replies_reused == 24 and llm3.calls == []


def test_changed_prompt_settings_are_not_reused(tmp_path):
    build(tmp_path, fake_teacher())
    llm = fake_teacher()
    report = build(tmp_path, llm, cfg=CFG.model_copy(update={"generate_max_tokens": 100}))
    assert report.teacher_replies_reused == 12  # the verdict prompts are unchanged, the generations are not
    assert len(llm.calls) == 12


def test_heldout_split_is_by_question_and_deterministic(tmp_path):
    cfg = CFG.model_copy(update={"heldout_fraction": 0.3})
    report = build(tmp_path, fake_teacher(), cfg=cfg, n=30)
    assert report.records["heldout"] > 0 and report.records["train"] > 0
    held = {r.provenance.question_id for r in read_records(tmp_path / "heldout.jsonl")}
    train = {r.provenance.question_id for r in read_records(tmp_path / "train.jsonl")}
    assert not held & train
    assert 3 <= len(held) <= 16
    assert all(split_of(f"train:{q}", cfg) == "heldout" for q in held)


def test_parse_teacher_forms():
    assert parse_teacher("bundled").model == "qwen2.5-coder-0.5b-instruct"
    assert parse_teacher("bundled:smollm2-135m-instruct").backend == "llamacpp"
    c = parse_teacher("http://h:8000/v1/", "Qwen/Qwen2.5-7B-Instruct", max_retries=5)
    assert (c.backend, c.base_url, c.model, c.max_retries) == ("openai", "http://h:8000/v1", "Qwen/Qwen2.5-7B-Instruct", 5)
    with pytest.raises(ValueError, match="bundled:NAME"):
        parse_teacher("gpt-4")
    with pytest.raises(ValueError, match="unknown bundled teacher 'nope'"):
        parse_teacher("bundled:nope")
    with pytest.raises(ValueError, match="base model"):
        parse_teacher("bundled:gemma3-270m")
    with pytest.raises(ValueError, match="--model"):
        parse_teacher("https://api.example.com/v1")
