"""Reproductions as data (:mod:`longrag.eval.regress`): tolerances, figure paths, and every
experiment YAML of the repository loads (the runs themselves: tests/jobs/test_regress_cli.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from longrag.eval.regress import Experiment, check, load_experiments

REPRO = Path(__file__).resolve().parents[2] / "repro"


def test_tolerances_absolute_relative_and_default():
    exp = Experiment.model_validate({"name": "t", "title": "t", "readme": "r", "command": ["python"], "tolerance": 0.1,
                                     "figures": [{"name": "a", "path": "a", "expected": 1.0},
                                                 {"name": "b", "path": "b", "expected": 200, "rel_tolerance": 0.05}]})
    ok = {c.figure: c.ok for c in check(exp, {"a": 1.1, "b": 210})}
    assert ok == {"a": True, "b": True}
    assert [c.ok for c in check(exp, {"a": 1.11, "b": 189})] == [False, False]
    with pytest.raises(ValueError, match="JMESPath"):
        Experiment.model_validate({"name": "t", "title": "t", "readme": "r", "command": ["x"],
                                   "figures": [{"name": "a", "path": "runs[?", "expected": 1}]})


def test_the_repository_reproductions_load():
    exps = load_experiments(REPRO)
    names = {e.name for e in exps}
    assert {"mixpr-formats", "index-capacity", "sample-index-grouping", "hotpotqa-retrieval-grouped-titles"} <= names
    assert any(e.slow for e in exps) and any(not e.slow for e in exps)
    for e in exps:
        assert e.command[:3] == ["python", "-m", e.command[2]] and e.command[2].startswith("jobs."), e.name
        assert e.argv("/o", sys.executable)[0] == sys.executable
