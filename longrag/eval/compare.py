"""Runs of the same questions side by side, with the noise: a paired bootstrap over the questions.

Two settings read the same questions; a difference in mean EM or F1 is worth a default only when
it is larger than what resampling the questions gives. :func:`paired_bootstrap` resamples the
questions (with replacement, the same sample for both runs) and returns the mean difference and its
95% interval; :func:`compare_runs` does it for every run against the first, per metric, over the
questions all runs answered (matched by ``qid``).

    python -m jobs.evaluate --compare reports/stored reports/evidence reports/packed --out reports/cmp
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Difference", "compare_runs", "comparison_md", "paired_bootstrap", "run_labels"]

METRICS = ("em", "f1", "reader_paragraph_recall", "reader_s")


@dataclass(frozen=True)
class Difference:
    """``b - a`` over paired questions: the mean, its 95% bootstrap interval, and the question count."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def significant(self) -> bool:
        """The interval leaves out 0."""
        return self.low > 0 or self.high < 0


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, samples: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> Difference:
    """Mean of ``b[i] - a[i]`` and its percentile interval over ``samples`` resamplings of the pairs."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or len(x) == 0:
        raise ValueError(f"paired samples must be two equal non-empty lists, got {x.shape} and {y.shape}")
    d = y - x
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(samples, len(d)))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    return Difference(float(d.mean()), float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail)),
                      len(d))


def _rows(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    from longrag.eval.runs import read_run

    results, _, _ = read_run(run_dir)
    return {str(r["qid"]): r for r in results}


def run_labels(run_dirs: Sequence[str | Path]) -> list[str]:
    """Each run's folder name, or its last two path parts where the names repeat (``x/run``, ``y/run``)."""
    paths = [Path(d) for d in run_dirs]
    names = [p.name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [str(Path(*p.parts[-2:])) for p in paths]


def compare_runs(run_dirs: Sequence[str | Path], metrics: Sequence[str] = METRICS, *, samples: int = 10_000
                 ) -> dict[str, Any]:
    """Each run's means over the questions every run answered, and its paired difference from the first."""
    if len(run_dirs) < 2:
        raise ValueError("compare needs at least two run directories")
    runs = list(zip(run_labels(run_dirs), (_rows(d) for d in run_dirs)))
    shared = sorted(set.intersection(*(set(rows) for _, rows in runs)))
    if not shared:
        raise ValueError("the runs share no question (qid): they are not over the same questions")
    base_label, base = runs[0]
    out: dict[str, Any] = {"questions": len(shared), "base": base_label, "runs": []}
    for i, (label, rows) in enumerate(runs):
        entry: dict[str, Any] = {"run": label, "mean": {}, "vs_base": {}}
        for m in metrics:
            if any(rows[q].get(m) is None for q in shared):
                continue
            vals = [float(rows[q][m]) for q in shared]
            entry["mean"][m] = float(np.mean(vals))
            if i > 0:
                d = paired_bootstrap([float(base[q][m]) for q in shared], vals, samples=samples)
                entry["vs_base"][m] = {"mean": d.mean, "low": d.low, "high": d.high, "significant": d.significant}
        out["runs"].append(entry)
    return out


def comparison_md(cmp: dict[str, Any]) -> str:
    """A markdown table: per run the means (x100 for rates) and, after the first, ``+d [low, high]``."""
    metrics = [m for m in METRICS if any(m in r["mean"] for r in cmp["runs"])]
    scale = {m: (1.0 if m == "reader_s" else 100.0) for m in metrics}
    head = "| run | " + " | ".join(metrics) + " |"
    lines = [head, "| --- " * (len(metrics) + 1) + "|"]
    for r in cmp["runs"]:
        cells = []
        for m in metrics:
            if m not in r["mean"]:
                cells.append("-")
                continue
            cell = f"{r['mean'][m] * scale[m]:.1f}"
            d = r["vs_base"].get(m)
            if d is not None:
                s = scale[m]
                cell += f" ({d['mean'] * s:+.1f} [{d['low'] * s:+.1f}, {d['high'] * s:+.1f}])"
            cells.append(cell)
        lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"{cmp['questions']} questions every run answered; (+d [low, high]): the paired difference from "
                 f"{cmp['base']} and its 95% bootstrap interval over the questions.")
    return "\n".join(lines)
