"""The paired bootstrap (longrag.eval.compare) against the exact bootstrap distribution, enumerated
for a few pairs, and run comparison over run directories written by the report writer."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from longrag.eval.compare import compare_runs, comparison_md, paired_bootstrap, run_labels


def _exact_interval(d: list[float], level: float = 0.95) -> tuple[float, float]:
    """Every resample of n differences (n^n ordered draws, each equally likely): the percentile interval."""
    means = sorted(float(np.mean(s)) for s in itertools.product(d, repeat=len(d)))
    return float(np.percentile(means, (1 - level) / 2 * 100)), float(np.percentile(means, 100 - (1 - level) / 2 * 100))


@pytest.mark.parametrize("seed", range(3))
def test_interval_matches_the_exact_bootstrap(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2, 6).astype(float)
    b = rng.integers(0, 2, 6).astype(float)
    lo, hi = _exact_interval(list(b - a))
    got = paired_bootstrap(a, b, samples=60_000, seed=seed)
    assert got.mean == pytest.approx(float(np.mean(b - a)))
    assert got.low == pytest.approx(lo, abs=0.0834) and got.high == pytest.approx(hi, abs=0.0834)  # one step of 1/6 / 2


def test_significance_follows_the_interval():
    same = paired_bootstrap([1, 0, 1, 0] * 10, [1, 0, 1, 0] * 10)
    assert same.mean == 0 and not same.significant
    better = paired_bootstrap([0] * 40, [1] * 30 + [0] * 10)
    assert better.significant and better.low > 0.5
    with pytest.raises(ValueError, match="paired"):
        paired_bootstrap([1, 2], [1])


def _run(tmp_path, name, rows):
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"dataset": "hotpotqa", "label": name}))
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_compare_runs_pairs_by_question(tmp_path):
    a = _run(tmp_path, "stored", [{"qid": str(i), "em": 0.0, "f1": 0.2} for i in range(20)])
    b = _run(tmp_path, "packed", [{"qid": str(i), "em": float(i < 10), "f1": 0.2} for i in reversed(range(21))])
    cmp = compare_runs([a, b], samples=2000)
    assert cmp["questions"] == 20  # question 20 only in one run
    packed = cmp["runs"][1]
    assert packed["mean"]["em"] == pytest.approx(0.5) and packed["vs_base"]["em"]["significant"]
    assert packed["vs_base"]["f1"]["mean"] == 0 and not packed["vs_base"]["f1"]["significant"]
    md = comparison_md(cmp)
    assert "| packed | 50.0 (+50.0 [" in md and "20 questions" in md
    again = compare_runs([a, a], samples=200)  # the same run twice: the second still compared with the first
    assert again["runs"][1]["vs_base"]["em"]["mean"] == 0
    assert run_labels(["x/run", "y/run"]) == ["x/run", "y/run"] and run_labels(["x/a", "y/b"]) == ["a", "b"]
    with pytest.raises(ValueError, match="no question"):
        compare_runs([a, _run(tmp_path, "other", [{"qid": "x", "em": 1.0}])])
