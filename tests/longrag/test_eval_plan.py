"""The typed evaluation config and the settings an evaluation compares."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from longrag.eval.plan import EvalConfig, EvalRun, file_digest, settings_of


def test_settings_of():
    def as_tuples(settings):
        return [(s.unit, s.links, s.label) for s in settings]

    assert as_tuples(settings_of(["grouped", "document"], ["titles"])) == [
        ("grouped", "titles", "grouped"), ("document", "titles", "document")
    ]
    assert as_tuples(settings_of(["passage", "grouped"], ["titles", "tfidf"])) == [
        ("passage", "titles", "passage"), ("grouped", "titles", "grouped-titles"), ("grouped", "tfidf", "grouped-tfidf")
    ]


def test_eval_config_validates_and_records_what_it_ran():
    ev = EvalConfig(dataset="hotpotqa", data="d", out="o", ks=[4, 1, 4], pipeline="longrag", reader_k=8)
    assert ev.ks == [1, 4] and ev.k_max() == 8 and ev.reads
    assert EvalConfig(dataset="hotpotqa", data="d", out="o", ks=[2]).k_max() == 2
    report = EvalRun(eval=ev).report_config()
    assert set(report) == {"longrag", "eval"} and report["eval"]["k"] == [1, 4]
    assert report["eval"]["pipeline"] == "longrag"
    with pytest.raises(ValidationError, match="retrieve"):  # the error names the valid pipelines
        EvalConfig(dataset="hotpotqa", data="d", out="o", pipeline="dual-x")
    for bad in ({"units": ["chapter"]}, {"ks": [0]}, {"pool": 0}, {"reader_k": 0}, {"units": []}):
        with pytest.raises(ValidationError):
            EvalConfig(dataset="hotpotqa", data="d", out="o", **bad)
    assert EvalRun(eval=ev).config_for("passage").units.kind == "passage"


def test_file_digest(tmp_path):
    f = tmp_path / "c.json"
    f.write_bytes(b"abc")
    d = file_digest(f)
    assert d["bytes"] == 3
    assert d["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # sha256("abc")
    with pytest.raises(ValueError):
        file_digest(tmp_path / "missing")
