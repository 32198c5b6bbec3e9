"""lab.budget_curve over run folders written as jobs.evaluate writes them: each run's budget read from
its config, the rows ordered by dataset and budget, a missing budget refused, the plot a real PNG."""

from __future__ import annotations

import json

import pytest

from lab.budget_curve import main, read_run


def _run(folder, dataset, budget, em, f1, rpr, s):
    folder.mkdir(parents=True)
    config = {"longrag": {"reader": {"max_context_tokens": budget}, "llm": {"model": "qwen2.5-coder-0.5b-instruct"}}}
    metrics = {"dataset": dataset, "n": 100, "reader_k": 2, "qa": {"em": em, "f1": f1, "n": 100},
               "reader_paragraph_recall": rpr, "retrieval": {"paragraph_recall@2": 0.91}, "avg_context_tokens": budget * 0.8,
               "reader_s": s, "config": config}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def test_rows_by_dataset_and_budget_and_a_png(tmp_path, capsys):
    runs = [_run(tmp_path / "m2", "musique", 2048, 0.05, 0.12, 0.64, 9.0),
            _run(tmp_path / "h1", "hotpotqa", 1024, 0.33, 0.39, 0.89, 6.0),
            _run(tmp_path / "h0", "hotpotqa", 512, 0.26, 0.345, 0.795, 3.96)]
    assert read_run(runs[2])["budget"] == 512 and read_run(runs[2])["pr_k"] == 0.91
    out = tmp_path / "curve.png"
    assert main([str(r) for r in runs] + ["--out", str(out)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| hotpotqa") or line.startswith("| musique")]
    assert [r.split(" | ")[2] for r in rows] == ["512", "1,024", "2,048"]
    assert "| 26.0 | 34.5 | 79.5 | 91.0 | 410 | 3.96 |" in rows[0]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_a_budget_is_refused(tmp_path):
    folder = _run(tmp_path / "x", "hotpotqa", 512, 0.2, 0.3, 0.7, 3.0)
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics["config"]["longrag"]["reader"] = {}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    with pytest.raises(ValueError, match="no reader.max_context_tokens"):
        read_run(folder)
