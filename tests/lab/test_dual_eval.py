"""Dual-perspective evaluation (Table 3 layout): question selection from the bundled samples, shared
extraction/filter across strategies, dense-only vs reranked rows, checkpoint resume, the tables and the
plot. A scripted LLM and a bag-of-words encoder stand in for the models (the real ones run in
tests/longrag/test_dual_real.py)."""

from __future__ import annotations

import asyncio

import pytest

from lab import dual_bench as db
from lab import dual_report as dr
from longrag.config import DualConfig
from longrag.dual.paragraphs import index_paragraphs
from longrag.dual.pipeline import DualPipeline
from longrag.eval.datasets import Paragraph, QAExample
from tests.fakes import ScriptedLLM
from tests.longrag.test_dual_pipeline import _kinds, _stage_reply
from tests.longrag.test_dual_retrieval import _BagEncoder


def _example(qid: str) -> QAExample:
    return QAExample(
        qid=qid, question="In which country was Marie Curie born?", answers=["Poland"], gold_titles=["Marie Curie"],
        supporting=[("Marie Curie", 0), ("Warsaw", 1)], type="bridge",
        paragraphs=[
            Paragraph("Bananas", "Bananas are rich in potassium. They are yellow."),
            Paragraph("Marie Curie", "Marie Curie was born in Warsaw. She moved to Paris.", True),
            Paragraph("Warsaw", "Warsaw, where Marie Curie was born, is a city in the country of Poland.", True),
            Paragraph("Everest", "Mount Everest is the highest mountain."),
        ],
    )  # fmt: skip


class _PreferBananas:
    """A fake reranker that puts the banana paragraph first (to tell reranked rows from dense ones)."""

    name = "fake-bananas"

    def score(self, query, texts):
        return [10.0 if "Banana" in t else 0.0 for t in texts]


def _cfg(**kw) -> db.DualEvalConfig:
    return db.DualEvalConfig(dual=DualConfig(rerank_k=2, dense_candidates=4), **kw)


def test_config_rejects_unknown_names_with_the_valid_ones():
    with pytest.raises(ValueError, match="valid: \\['hotpotqa', 'musique'\\]"):
        db.DualEvalConfig(datasets=("squad",))
    with pytest.raises(ValueError, match="valid: R&B, R&L, Ext, Fil, E&F"):
        db.DualEvalConfig(strategies=("R&B", "RAG"))
    with pytest.raises(ValueError):
        db.DualEvalConfig(limit=0)


def test_select_questions_heldout_is_the_reranker_split():
    from longrag.training.reranker_data import split_by_question

    cfg = db.DualEvalConfig(limit=5)
    held = db.select_questions("hotpotqa", cfg)
    first = db.select_questions("hotpotqa", cfg.model_copy(update={"questions": "first"}))
    assert len(held) == len(first) == 5 and all(ex.paragraphs for ex in held)
    later = db.select_questions("hotpotqa", cfg.model_copy(update={"start": 2, "limit": 2}))
    assert [ex.qid for ex in later] == [ex.qid for ex in held[2:4]]
    from longrag.data import HOTPOTQA_SAMPLE, data_path
    from longrag.eval.datasets import load_hotpotqa

    every = [("hotpotqa", ex) for ex in load_hotpotqa(data_path(HOTPOTQA_SAMPLE)).examples]
    train, _ = split_by_question(every, 0.2, 0)
    trained = {ex.qid for _, ex in train}
    assert not trained & {ex.qid for ex in held}  # none of them trained the reranker
    assert trained & {ex.qid for ex in first}


def test_question_paragraphs_and_support_recall():
    paras, support = db.question_paragraphs(_example("q1"))
    assert [p.id for p in paras] == ["q1/0", "q1/1", "q1/2", "q1/3"] and support == {"q1/1", "q1/2"}
    index = index_paragraphs(paras, _BagEncoder(), None, DualConfig(rerank_k=1))
    r = index.retriever.retrieve("Where was Marie Curie born?")
    assert db.support_recall(r, support) == 0.5


def test_run_many_shares_extraction_and_filter_across_strategies():
    paras, _ = db.question_paragraphs(_example("q1"))
    index = index_paragraphs(paras, _BagEncoder(), None, DualConfig(rerank_k=2))
    llm = _stage_llm()
    pipe = DualPipeline(llm, DualConfig(rerank_k=2))
    r = index.retriever.retrieve("In which country was Marie Curie born?")
    res = asyncio.run(pipe.run_many("In which country was Marie Curie born?", r, index.paragraphs, list(db.DUAL_STRATEGIES)))
    kinds = _kinds(llm)
    # one extraction, one CoT + 2 judgements, five generator calls: not 2 extractions and 2 filters
    assert kinds.count("ext") == 1 and kinds.count("cot") == 1 and kinds.count("judge") == 2 and kinds.count("gen") == 5
    assert res["E&F"].global_information == res["Ext"].global_information
    assert res["E&F"].kept_chunk_ids == res["Fil"].kept_chunk_ids
    assert [s.stage for s in res["E&F"].stages] == ["extractor", "filter", "generator"]
    assert res["R&B"].global_information is None and res["R&B"].judgements == []
    assert all(r.answer == "Poland" for r in res.values())


def _stage_llm() -> ScriptedLLM:
    llm = ScriptedLLM([], default="x")
    llm._next = lambda messages: _stage_reply()(messages)  # type: ignore[method-assign]
    return llm


def test_eval_rows_reranked_rows_checkpoint_and_resume(tmp_path):
    cfg = _cfg(strategies=("R&B", "Ext", "E&F"), reranked_strategies=("R&B",))
    examples = {"hotpotqa": [_example("q1"), _example("q2")], "musique": [_example("m1")]}
    ck = tmp_path / "ck.jsonl"
    llm = _stage_llm()
    rows = asyncio.run(db.run_dual_eval(cfg, llm, _BagEncoder(), _PreferBananas(), checkpoint=ck, examples=examples))
    assert len(rows) == 3 * (3 + 1)
    assert [r["qid"] for r in rows[::4]] == ["q1", "m1", "q2"]  # datasets interleaved, question-major
    assert {(r["retrieval"], r["strategy"]) for r in rows} == {
        ("dense only", "R&B"), ("dense only", "Ext"), ("dense only", "E&F"), ("reranked", "R&B")}
    dense = [r for r in rows if r["retrieval"] == "dense only"]
    assert all(r["f1"] == 1.0 and r["em"] == 1.0 for r in dense)
    assert all(r["support_recall"] == 1.0 for r in dense)  # the bag encoder finds Curie and Warsaw
    rer = [r for r in rows if r["retrieval"] == "reranked"]
    assert all(r["support_recall"] == 0.5 for r in rer)  # bananas pushed one supporting paragraph out
    ef = next(r for r in rows if r["strategy"] == "E&F")
    assert ef["llm_calls"] == 1 + 1 + 2 + 1 and ef["generator_input_tokens"] > 0
    n_calls = len(llm.calls)
    assert n_calls == 3 * (1 + 1 + 2 + 3 + 1)  # per question: ext, cot, 2 judges, 3 dense + 1 reranked generations

    # a rerun with the same setup answers nothing again and returns the same rows
    llm2 = _stage_llm()
    again = asyncio.run(db.run_dual_eval(cfg, llm2, _BagEncoder(), _PreferBananas(), checkpoint=ck, examples=examples))
    assert llm2.calls == [] and again == rows
    assert sorted(map(str, db.checkpoint_rows(ck))) == sorted(map(str, rows))  # a report from the file alone
    # one more strategy: only it is answered (its filter runs, the extraction is not needed)
    llm3 = _stage_llm()
    more = asyncio.run(db.run_dual_eval(cfg.model_copy(update={"strategies": ("R&B", "Ext", "E&F", "Fil")}), llm3,
                                        _BagEncoder(), _PreferBananas(), checkpoint=ck, examples=examples))  # fmt: skip
    assert len(more) == len(rows) + 3 and _kinds(llm3).count("ext") == 0 and _kinds(llm3).count("gen") == 3
    # no reranker now: the dense rows are reused, no reranked rows
    llm4 = _stage_llm()
    dense_only = asyncio.run(db.run_dual_eval(cfg, llm4, _BagEncoder(), None, checkpoint=ck, examples=examples))
    assert llm4.calls == [] and dense_only == [r for r in rows if r["retrieval"] == "dense only"]


def test_summary_tables_and_plot(tmp_path):
    cfg = _cfg(reranked_strategies=("R&B",))
    examples = {"hotpotqa": [_example("q1")], "musique": [_example("m1"), _example("m2")]}
    rows = asyncio.run(db.run_dual_eval(cfg, _stage_llm(), _BagEncoder(), _PreferBananas(), examples=examples))
    summary = dr.summarize(rows)
    assert [(s["retrieval"], s["strategy"]) for s in summary][:2] == [("dense only", "R&B"), ("dense only", "R&B")]
    t3 = dr.table3_markdown(summary)
    lines = t3.splitlines()
    assert lines[0] == "| strategy | musique F1 (2 q) | hotpotqa F1 (1 q) | avg F1 |"
    assert [ln.split(" | ")[0] for ln in lines[2:]] == ["| R&B", "| R&L", "| Ext", "| Fil", "| E&F"]
    assert "| E&F | 100.0 | 100.0 | 100.0 |" in t3
    assert "generator input" in dr.tokens_markdown(summary)
    rr = dr.reranker_markdown(summary)
    assert "| dense only | R&B | 100.0 / 100.0 | 100.0 / 100.0 |" in rr and "| reranked | R&B | 50.0 / 100.0" in rr
    png = dr.plot_table3(summary, tmp_path / "t3.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_cli_rejects_bad_strategy(capsys):
    from jobs.eval_dual import main

    assert main(["--strategy", "R&B,XYZ"]) == 2
    assert "valid: R&B, R&L, Ext, Fil, E&F" in capsys.readouterr().err


def test_retrieval_effect_compares_dense_and_reranked_support_recall():
    cfg = _cfg()
    eff = db.retrieval_effect(cfg, _BagEncoder(), _PreferBananas(), {"hotpotqa": [_example("q1"), _example("q2")]},
                              ks=(1, 2))  # fmt: skip
    by_k = {e["k"]: e for e in eff}
    assert by_k[2]["dense_recall"] == 100.0 and by_k[2]["reranked_recall"] == 50.0 and by_k[2]["questions"] == 2
    assert by_k[1]["reranked_recall"] == 0.0  # the banana paragraph first


def test_report_from_an_unfinished_run_writes_tables_json_and_plot(tmp_path):
    cfg = _cfg(datasets=("hotpotqa",), strategies=("R&B", "Fil"))
    asyncio.run(db.run_dual_eval(cfg, _stage_llm(), _BagEncoder(), None, checkpoint=tmp_path / db.CHECKPOINT,
                                 examples={"hotpotqa": [_example("q1")]}))  # fmt: skip
    report = db.run_and_report(cfg, tmp_path, report_only=True, torch_threads=1, command=["x"])
    assert report["questions"] == {"hotpotqa": ["q1"]} and "| Fil | 100.0 | 100.0 |" in report["markdown"]
    saved = __import__("json").loads((tmp_path / "dual_eval.json").read_text())
    assert saved["command"] == ["x"] and len(saved["summary"]) == 2
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "table3.md").read_text().startswith("| strategy | hotpotqa F1 (1 q)")
    assert (tmp_path / "dual_table3.png").is_file()
    with pytest.raises(ValueError, match="no rows"):
        db.run_and_report(cfg, tmp_path / "empty", report_only=True)


def test_jobs_evaluate_pipeline_dual_checks_strategy_and_dataset(capsys, tmp_path):
    from jobs.evaluate import main

    data = "data/hotpotqa/hotpotqa_train100.json.gz"
    assert main(["--dataset", "hotpotqa", "--data", data, "--pipeline", "dual", "--strategy", "R&B,XX",
                 "--out", str(tmp_path)]) == 2  # fmt: skip
    assert "valid: R&B, R&L, Ext, Fil, E&F" in capsys.readouterr().err
    assert main(["--dataset", "nq", "--data", data, "--pipeline", "dual", "--out", str(tmp_path)]) == 2
    assert "valid: ['hotpotqa', 'musique']" in capsys.readouterr().err


def _judging_llm(judge) -> ScriptedLLM:
    llm = ScriptedLLM([], default="x")
    llm._next = lambda messages: _stage_reply(judge)(messages)  # type: ignore[method-assign]
    return llm


def test_filter_precision_and_recall_against_the_support_labels():
    # 3 of 4 paragraphs retrieved (k=3): Curie and Warsaw support, one distractor does not. The
    # filter keeps the Warsaw chunk and a distractor: precision 1/2, recall 1/2; R&B keeps all 3.
    cfg = db.DualEvalConfig(dual=DualConfig(rerank_k=3, dense_candidates=4), datasets=("hotpotqa",),
                            strategies=("R&B", "Fil"))  # fmt: skip
    keep = lambda p: '{"status": true}' if ("Warsaw," in p or "Bananas" in p or "Everest" in p) else '{"status": false}'
    rows = asyncio.run(db.run_dual_eval(cfg, _judging_llm(keep), _BagEncoder(), None,
                                        examples={"hotpotqa": [_example("q1")]}))  # fmt: skip
    by = {r["strategy"]: r for r in rows}
    assert by["R&B"]["retrieved"] == 3 and by["R&B"]["retrieved_supporting"] == 2
    assert by["R&B"]["kept"] == 3 and by["R&B"]["kept_supporting"] == 2
    assert by["Fil"]["kept"] == 2 and by["Fil"]["kept_supporting"] == 1
    s = {x["strategy"]: x for x in dr.summarize(rows)}
    assert (s["Fil"]["filter_precision"], s["Fil"]["filter_recall"]) == (50.0, 50.0)
    assert (s["R&B"]["filter_precision"], s["R&B"]["filter_recall"]) == (66.7, 100.0)
    # rows checkpointed before the counts existed give NaN, not an error
    old = [{k: v for k, v in r.items() if k not in ("kept_supporting", "retrieved_supporting")} for r in rows]
    q = dr.filter_quality(old)
    assert q["filter_precision"] != q["filter_precision"] and q["filter_recall"] != q["filter_recall"]


def test_exclude_qids_leaves_trained_questions_out_before_the_limit():
    cfg = db.DualEvalConfig(limit=4, datasets=("musique",))
    held = db.select_questions("musique", cfg)
    without = db.select_questions("musique", cfg.model_copy(update={"exclude_qids": (held[1].qid,)}))
    assert [ex.qid for ex in without] == [held[0].qid, *[ex.qid for ex in held[2:]],
                                          db.select_questions("musique", cfg.model_copy(update={"limit": 5}))[4].qid]


def test_trained_question_ids_reads_the_train_split_only(tmp_path):
    from longrag.lrg.records import InstructionRecord, trained_question_ids

    def rec(i: int, qid: str, split: str) -> str:
        return InstructionRecord.model_validate({
            "id": f"r{i}", "kind": "task", "split": split,
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "provenance": {"teacher": None, "prompts_sha": "x", "source": "hotpotqa_train100", "question_id": qid,
                           "paragraph_titles": []},
        }).model_dump_json()  # fmt: skip

    (tmp_path / "train.jsonl").write_text(rec(1, "qa", "train") + "\n" + rec(2, "qb", "train") + "\n")
    (tmp_path / "heldout.jsonl").write_text(rec(3, "qc", "heldout") + "\n")
    assert trained_question_ids(tmp_path) == {"qa", "qb"} == trained_question_ids(tmp_path / "train.jsonl")
    with pytest.raises(FileNotFoundError, match="jobs.lrg_instruct"):
        trained_question_ids(tmp_path / "nowhere")


def test_comparison_of_two_runs_over_the_same_questions(tmp_path):
    cfg = db.DualEvalConfig(dual=DualConfig(rerank_k=3, dense_candidates=4), datasets=("hotpotqa",),
                            strategies=("R&B", "Fil"))  # fmt: skip
    ex = {"hotpotqa": [_example("q1")]}
    keep_all = lambda p: '{"status": true}'
    keep_gold = lambda p: '{"status": true}' if ("Curie was" in p or "Warsaw," in p) else '{"status": false}'
    reports = []
    for name, judge in (("base", keep_all), ("tuned", keep_gold)):
        asyncio.run(db.run_dual_eval(cfg, _judging_llm(judge), _BagEncoder(), None, checkpoint=tmp_path / name / db.CHECKPOINT,
                                     examples=ex))  # fmt: skip
        reports.append(db.run_and_report(cfg, tmp_path / name, report_only=True, torch_threads=1))
    md = dr.write_comparison(dr.load_report(tmp_path / "base"), reports[1], tmp_path / "tuned")
    assert "| Fil | hotpotqa | 1 | 100.0 -> 100.0 (+0.0) | 100.0 -> 100.0 | 66.7 -> 100.0 | 100.0 -> 100.0 |" in md
    assert (tmp_path / "tuned" / "comparison.md").is_file() and (tmp_path / "tuned" / "comparison.json").is_file()
    other = dict(reports[1], questions={"hotpotqa": ["q9"]})
    with pytest.raises(ValueError, match="other questions"):
        dr.write_comparison(reports[0], other, tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="dual_eval.json"):
        dr.load_report(tmp_path / "missing")
