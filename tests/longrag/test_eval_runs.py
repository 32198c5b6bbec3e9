"""Run directories: one setting written, read back unchanged, combined with another; bad combinations refused."""

import json

import pytest

from longrag.eval import pipeline as P
from longrag.eval import report as R
from longrag.eval import runs

UNITS = [
    {"unit_id": "u1", "titles": ["A"], "score": 0.9, "n_tokens": 100, "text": "Alpha mentions Paris."},
    {"unit_id": "u2", "titles": ["B"], "score": 0.8, "n_tokens": 300, "text": "Beta says 1988."},
]


def _setting(kind: str, dataset: str = "hotpotqa", swap: bool = False):
    retrieved = UNITS[::-1] if swap else UNITS
    rows = [
        {"qid": "q1", "question": "Where?", "answers": ["Paris"], "type": "bridge", "gold_titles": ["A"],
         "unit_kind": kind, "retrieved": retrieved},
        {"qid": "q2", "question": "When?", "answers": ["1988"], "type": "bridge", "gold_titles": ["B"],
         "unit_kind": kind, "retrieved": retrieved},
    ]
    scored = R.score_results(rows, ks=[1, 2])
    flat = P.flat_metrics(scored, R.summarize(scored), dataset=dataset, unit=kind, reader_k=None)
    return scored, flat


def test_write_read_combine(tmp_path):
    a_scored, a_flat = _setting("grouped")
    b_scored, b_flat = _setting("document", swap=True)
    for d, (scored, flat) in (("a", (a_scored, a_flat)), ("b", (b_scored, b_flat))):
        runs.write_run(tmp_path / d, scored, flat, {"cfg": d}, {"git": "x"}, {"corpus": {"n": 2}}, f"run {d}")
    doc = json.loads((tmp_path / "a/metrics.json").read_text())
    assert doc["unit"] == "grouped" and doc["corpus"] == {"n": 2} and doc["config"] == {"cfg": "a"}
    assert doc["retrieval"]["recall@1"] == 0.5 and doc["retrieval"]["recall@2"] == 1.0
    assert "| grouped |" in (tmp_path / "a/report.md").read_text()

    results, flats, back = runs.read_run(tmp_path / "b")
    assert [r["qid"] for r in results] == ["q1", "q2"]
    assert flats[0]["unit"] == "document" and flats[0]["retrieval"] == b_flat["retrieval"]
    assert back["provenance"] == {"git": "x"}

    paths = runs.combine([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "ab"), ["test"])
    combined = json.loads(open(paths["metrics"]).read())
    assert [r["unit"] for r in combined["runs"]] == ["grouped", "document"]
    assert combined["n"] == 2 and combined["provenance"]["combined_from"] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert set(combined["summary"]["retrieval"]) == {"grouped", "document"}
    md = open(paths["report"]).read()
    assert "| grouped |" in md and "| document |" in md


def test_combine_refuses_mixed_datasets_and_duplicate_labels(tmp_path):
    for d, kind, ds in (("h", "grouped", "hotpotqa"), ("m", "document", "musique"), ("h2", "grouped", "hotpotqa")):
        scored, flat = _setting(kind, dataset=ds)
        runs.write_run(tmp_path / d, scored, flat, {}, {}, {}, d)
    with pytest.raises(ValueError, match="different datasets"):
        runs.combine([str(tmp_path / "h"), str(tmp_path / "m")], str(tmp_path / "x"), ["test"])
    with pytest.raises(ValueError, match="share setting labels"):
        runs.combine([str(tmp_path / "h"), str(tmp_path / "h2")], str(tmp_path / "y"), ["test"])
