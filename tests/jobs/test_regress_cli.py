"""``python -m jobs.regress`` reruns an experiment YAML's command and fails (exit 1, a table of
drifts) when a figure leaves its tolerance. The experiment here is a tiny real command (a Python
one-liner printing its result JSON), so no Ray and no model is needed."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from jobs.regress import main

RESULT = {"runs": [{"unit": "grouped", "recall@2": 0.88, "tokens": 1159}], "n": 100}


def _write(folder: Path, name: str, figures: list[dict], **extra) -> None:
    code = f"import json; print('some log line'); print(json.dumps({RESULT!r}))"
    doc = {"name": name, "title": "toy", "readme": "nowhere", "command": ["python", "-c", code], "figures": figures,
           **extra}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


FIGURES = [
    {"name": "R@2", "path": "runs[?unit=='grouped'] | [0].\"recall@2\"", "expected": 0.88, "tolerance": 0.01},
    {"name": "tokens", "path": "runs[0].tokens", "expected": 1150, "rel_tolerance": 0.01},
    {"name": "n", "path": "n", "expected": 100},
]


def test_an_experiment_within_its_tolerances_passes(tmp_path, capsys):
    _write(tmp_path, "toy-ok", FIGURES)
    assert main(["--dir", str(tmp_path), "--work", str(tmp_path / "work")]) == 0
    out = capsys.readouterr().out
    assert "| toy-ok | R@2 | 0.88 | 0.88 | +0 | 0.01 | ok |" in out and "all 3 figures" in out
    saved = json.loads((tmp_path / "work" / "regress.json").read_text())
    assert saved["drifts"] == 0 and len(saved["checks"]) == 3


def test_a_drift_beyond_tolerance_fails_with_a_table_of_drifts(tmp_path, capsys):
    drifting = [*FIGURES[:2], {"name": "R@2 as in an older README", "path": "runs[0].\"recall@2\"", "expected": 0.80,
                               "tolerance": 0.05}, {"name": "missing", "path": "runs[0].nothing", "expected": 1}]
    _write(tmp_path, "toy-drift", drifting)
    assert main(["--dir", str(tmp_path), "--work", str(tmp_path / "work")]) == 1
    out = capsys.readouterr().out
    drifts = out.split("figures drifted beyond their tolerance")[1]
    assert "| toy-drift | R@2 as in an older README | 0.8 | 0.88 | +0.08 | 0.05 | DRIFT |" in drifts
    assert "missing" in drifts and "no number at" in drifts
    assert "| R@2 |" not in drifts  # only the drifts in the closing table


def test_a_failing_command_fails_every_figure_and_fast_skips_slow(tmp_path, capsys):
    doc = {"name": "broken", "title": "t", "readme": "r", "command": ["python", "-c", "import sys; sys.exit(3)"],
           "figures": [{"name": "x", "path": "x", "expected": 1}]}
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(doc))
    _write(tmp_path, "toy-slow", [{"name": "x", "path": "n", "expected": 0}], slow=True)
    assert main(["--dir", str(tmp_path), "--work", str(tmp_path / "w"), "--fast"]) == 1
    out = capsys.readouterr().out
    assert "exit 3" in out and "toy-slow" not in out
    assert main(["--dir", str(tmp_path), "--only", "nope"]) == 2
    assert "known: broken, toy-slow" in capsys.readouterr().err
