"""Report writer: scoring fills the metric fields, files carry the expected keys, PNGs decode."""

import json

import pytest

from longrag.eval import report as R

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _results():
    rows = []
    units = [
        {"unit_id": "u1", "titles": ["A"], "score": 0.9, "n_tokens": 100, "text": "Alpha mentions Paris."},
        {"unit_id": "u2", "titles": ["B", "C"], "score": 0.8, "n_tokens": 300, "text": "Beta and Gamma."},
        {"unit_id": "u3", "titles": ["D"], "score": 0.7, "n_tokens": 50, "text": "Delta says 1988."},
    ]
    for kind in ("document", "grouped"):
        for rk, preds in ((1, ["Paris", "no idea"]), (2, ["Paris", "1988"])):
            rows.append({"qid": "q1", "question": "Where?", "answers": ["Paris"], "type": "bridge",
                         "gold_titles": ["A", "C"], "unit_kind": kind, "reader_k": rk,
                         "prediction": preds[0], "retrieved": units, "latency_s": 1.5})
            rows.append({"qid": "q2", "question": "When?", "answers": ["1988"], "type": "comparison",
                         "gold_titles": ["D"], "unit_kind": kind, "reader_k": rk,
                         "prediction": preds[1], "retrieved": units[::-1], "latency_s": 0.5})
    return rows


def test_score_results_fills_metrics():
    scored = R.score_results(_results(), ks=[1, 2, 3])
    r = scored[0]
    assert r["em"] == 1.0 and r["refined_em"] == 1.0 and r["f1"] == 1.0
    assert r["answer_recall"] == {1: 1.0, 2: 1.0, 3: 1.0}
    assert r["gold_recall"] == {1: 0.0, 2: 1.0, 3: 1.0}
    assert r["context_tokens"] == {1: 100, 2: 400, 3: 450}
    q2 = scored[1]
    assert q2["em"] == 0.0 and q2["answer_recall"] == {1: 1.0, 2: 1.0, 3: 1.0} and q2["gold_recall"][1] == 1.0
    # answer recall limited to some types (LongRAG, Jiang et al., 2024, Section 4.2: HotpotQA bridge
    # questions only)
    only_bridge = R.score_results(_results(), ks=[1], answer_recall_types=["bridge"])
    assert "answer_recall" in only_bridge[0] and "answer_recall" not in only_bridge[1]
    # precomputed fields are kept
    pre = R.score_results([{"qid": "x", "answers": ["a"], "prediction": "b", "em": 1.0}], ks=[1])
    assert pre[0]["em"] == 1.0 and pre[0]["f1"] == 0.0
    with pytest.raises(ValueError, match="qid"):
        R.score_results([{"question": "no id"}])


def test_summarize_groups_settings_and_dedups_curves():
    s = R.summarize(R.score_results(_results(), ks=[1, 2, 3]))
    assert s["n_questions"] == 2 and s["n_results"] == 8
    settings = {(e["unit_kind"], e["reader_k"]): e for e in s["qa"]}
    assert set(settings) == {("document", 1), ("document", 2), ("grouped", 1), ("grouped", 2)}
    assert settings[("document", 1)]["em"] == 0.5 and settings[("document", 2)]["em"] == 1.0
    assert settings[("document", 1)]["by_type"]["bridge"]["em"] == 1.0
    assert settings[("document", 1)]["latency_s"] == pytest.approx(1.0)
    doc = s["retrieval"]["document"]
    assert doc["n_questions"] == 2 and doc["gold_recall_n"] == 2  # each question counted once
    assert doc["gold_recall"] == {1: 0.5, 2: 1.0, 3: 1.0}
    assert doc["context_tokens"] == {1: 75.0, 2: 375.0, 3: 450.0}


def test_write_report_files(tmp_path):
    scored = R.score_results(_results(), ks=[1, 2, 3])
    cfg = {"units": {"kind": "grouped", "max_group_tokens": 4096}}
    prov = {"git_commit": "abc123", "dataset": "hotpotqa_train100"}
    paths = R.write_report(tmp_path / "rep", scored, cfg, prov, title="Test run")
    m = json.loads((tmp_path / "rep/metrics.json").read_text())
    assert set(m) == {"summary", "config", "provenance", "plots"}
    assert m["config"] == cfg and m["provenance"] == prov
    assert set(m["summary"]) == {"n_results", "n_questions", "qa", "retrieval"}
    assert set(m["plots"]) == {"recall_vs_units.png", "recall_vs_tokens.png", "qa_vs_units.png", "qa_vs_tokens.png"}
    lines = (tmp_path / "rep/predictions.jsonl").read_text().splitlines()
    assert len(lines) == len(scored)
    row = json.loads(lines[0])
    assert {"qid", "prediction", "em", "refined_em", "f1", "answer_recall", "gold_recall", "retrieved"} <= set(row)
    assert "text" not in row["retrieved"][0] and row["retrieved"][0]["unit_id"] == "u1"
    md = (tmp_path / "rep/report.md").read_text()
    assert md.startswith("# Test run")
    for needle in ("## Answer quality", "| unit kind | reader k |", "### document units", "gold recall@k",
                   "![recall_vs_units](recall_vs_units.png)", "abc123", "## Config"):
        assert needle in md
    import matplotlib.image as mpimg

    for name in m["plots"]:
        p = tmp_path / "rep" / name
        assert paths[p.stem] == str(p)
        assert p.read_bytes()[:8] == PNG_MAGIC
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
        assert img[..., :3].std() > 0.01  # not a blank canvas


def test_report_without_retrieval_or_reader_k(tmp_path):
    rows = [{"qid": str(i), "answers": ["x"], "prediction": p, "type": "open"} for i, p in enumerate(["x", "y"])]
    paths = R.write_report(tmp_path, R.score_results(rows), {}, {})
    m = json.loads(open(paths["metrics"]).read())
    assert m["plots"] == [] and m["summary"]["qa"][0]["em"] == 0.5
    assert "## Retrieval" not in open(paths["report"]).read()
    with pytest.raises(ValueError):
        R.write_report(tmp_path, rows, [], {})  # type: ignore[arg-type]


def test_paragraph_recall_fields_are_scored_and_summarized():
    rows = [
        {"qid": "1", "question": "q", "answers": ["x"], "gold_titles": ["A"], "unit_kind": "grouped",
         "gold_paragraphs": ["alpha beta", "gamma delta"],
         "retrieved": [{"titles": ["A"], "text": "A\nalpha beta", "n_tokens": 3},
                       {"titles": ["B"], "text": "B\ngamma delta", "n_tokens": 3}],
         "reader_context": "A\nalpha beta"},
        {"qid": "2", "question": "q", "answers": ["x"], "gold_titles": ["C"], "unit_kind": "grouped",
         "gold_paragraphs": ["eps"], "retrieved": [{"titles": ["C"], "text": "C\nzeta", "n_tokens": 2},
                                                   {"titles": ["D"], "text": "D\neps", "n_tokens": 2}]},
    ]
    cut = lambda t, n: " ".join(t.split()[:n])  # noqa: E731
    scored = R.score_results(rows, ks=[1, 2], budgets=[3, 6], truncate=cut)
    assert scored[0]["paragraph_recall"] == {1: 0.5, 2: 1.0}
    assert scored[0]["paragraph_recall_tokens"] == {3: 0.5, 6: 1.0}
    assert scored[0]["reader_paragraph_recall"] == 0.5
    assert scored[1]["paragraph_recall"] == {1: 0.0, 2: 1.0} and "reader_paragraph_recall" not in scored[1]
    retr = R.summarize(scored)["retrieval"]["grouped"]
    assert retr["paragraph_recall"] == {1: 0.25, 2: 1.0}
    assert retr["paragraph_recall_tokens"] == {3: 0.25, 6: 1.0}
