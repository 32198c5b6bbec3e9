"""Reproductions as data: one YAML per experiment of the tables in docs/, with its command and the
figures it must reproduce within a tolerance (pyserini's "two-click reproductions" are the model).

An experiment file (``repro/*.yaml``)::

    name: mixpr-formats
    title: MixPR recall@100 by document format
    readme: "docs/mixpr.md: Recall by document format"
    slow: false                      # true: skipped by `jobs.regress --fast`
    command: [python, -m, jobs.bench, mixpr, --skip-timing, --skip-recall]
    result: stdout                   # the last stdout line is JSON; or a file path under {out}
    tolerance: 0.005                 # default absolute tolerance of the figures
    figures:
      - {name: lines 32K MixPR, path: "formats_summary[?format=='lines' && tokens==`32000`] | [0].mixpr", expected: 1.0}

``{out}`` in the command and the result path is the experiment's output folder. ``path`` is a
JMESPath expression (https://jmespath.org) into the result JSON. A figure drifts when
``|got - expected| > tolerance`` (absolute) or ``> rel_tolerance * |expected|`` where a relative
tolerance is given; a figure the result lacks is a drift too. No Ray here: ``jobs.regress`` runs
the commands.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jmespath
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Figure(BaseModel):
    """One number of a table in docs/ and where the experiment's result JSON holds it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    path: str = Field(description="JMESPath expression into the result JSON")
    expected: float
    tolerance: float | None = Field(None, ge=0, description="absolute; None takes the experiment's")
    rel_tolerance: float | None = Field(None, ge=0, description="relative to |expected|, instead of absolute")

    @field_validator("path")
    @classmethod
    def _compiles(cls, path: str) -> str:
        try:
            jmespath.compile(path)
        except jmespath.exceptions.JMESPathError as exc:
            raise ValueError(f"path {path!r} is not a JMESPath expression: {exc}") from None
        return path


class Experiment(BaseModel):
    """One reproduction: a command, where its result JSON is, and the figures it must give."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str
    readme: str = Field(description="the passage (docs page: section) whose table this reproduces")
    command: list[str] = Field(min_length=1)
    result: str = Field("stdout", description="'stdout' (last line is JSON) or a result file path, may use {out}")
    slow: bool = False
    minutes: float | None = Field(None, description="about how long it runs on the 2-core reference machine")
    timeout_s: float = Field(3600, gt=0)
    tolerance: float = Field(0.0, ge=0)
    figures: list[Figure] = Field(min_length=1)
    notes: str = ""

    @model_validator(mode="after")
    def _unique_figures(self) -> Experiment:
        names = [f.name for f in self.figures]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"experiment {self.name}: figure names repeat: {dup}")
        return self

    def argv(self, out: str | Path, python: str) -> list[str]:
        """The command with ``{out}`` filled in and ``python`` replaced by this interpreter."""
        args = [a.replace("{out}", str(out)) for a in self.command]
        return [python if i == 0 and a == "python" else a for i, a in enumerate(args)]


class FigureCheck(BaseModel):
    experiment: str
    figure: str
    expected: float
    got: float | None
    allowed: float
    ok: bool
    error: str | None = None

    @property
    def drift(self) -> float | None:
        return None if self.got is None else self.got - self.expected


def load_experiment(path: str | Path) -> Experiment:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
        exp = Experiment.model_validate(data)
    except (yaml.YAMLError, ValueError) as exc:
        raise ValueError(f"{p}: {exc}") from None
    if exp.name != p.stem:
        raise ValueError(f"{p}: name {exp.name!r} must match the file name {p.stem!r}")
    return exp


def load_experiments(folder: str | Path, only: list[str] | None = None) -> list[Experiment]:
    """Every ``*.yaml`` of ``folder``, sorted by name; ``only`` selects by name (an unknown name is
    an error listing the known ones)."""
    exps = [load_experiment(p) for p in sorted(Path(folder).glob("*.yaml"))]
    if only:
        known = {e.name for e in exps}
        unknown = [n for n in only if n not in known]
        if unknown:
            raise ValueError(f"unknown experiment(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        exps = [e for e in exps if e.name in only]
    return exps


def result_json(exp: Experiment, stdout: str, out: str | Path) -> Any:
    """The result JSON of a finished run: the last non-empty stdout line, or the result file."""
    if exp.result == "stdout":
        lines = [ln for ln in stdout.splitlines() if ln.strip()]
        if not lines:
            raise ValueError(f"{exp.name}: the command printed nothing (expected a JSON last line)")
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError as exc:
            raise ValueError(f"{exp.name}: the last stdout line is not JSON ({exc}): {lines[-1][:200]!r}") from None
    path = Path(exp.result.replace("{out}", str(out)))
    if not path.is_file():
        raise ValueError(f"{exp.name}: the command wrote no result file {path}")
    return json.loads(path.read_text())


def check(exp: Experiment, result: Any) -> list[FigureCheck]:
    """Each figure of ``exp`` against ``result``."""
    checks = []
    for f in exp.figures:
        allowed = f.rel_tolerance * abs(f.expected) if f.rel_tolerance is not None else (
            f.tolerance if f.tolerance is not None else exp.tolerance)
        value = jmespath.search(f.path, result)
        got, error = None, None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            error = f"no number at {f.path!r} (found {value!r})"
        else:
            got = float(value)
        ok = got is not None and abs(got - f.expected) <= allowed + 1e-12
        checks.append(FigureCheck(experiment=exp.name, figure=f.name, expected=f.expected, got=got,
                                  allowed=allowed, ok=ok, error=error))
    return checks


def failed(exp: Experiment, error: str) -> list[FigureCheck]:
    """Every figure of ``exp`` marked failed with ``error`` (the command failed or gave no result)."""
    return [FigureCheck(experiment=exp.name, figure=f.name, expected=f.expected, got=None, allowed=0.0, ok=False,
                        error=error) for f in exp.figures]


def drift_table(checks: list[FigureCheck], *, only_drifts: bool = False) -> str:
    """A markdown table of the checks (or of the drifts only)."""
    rows = [c for c in checks if not (only_drifts and c.ok)]
    lines = ["| experiment | figure | expected | got | drift | allowed | status |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in rows:
        got = "-" if c.got is None else f"{c.got:.4g}"
        drift = "-" if c.drift is None else f"{c.drift:+.4g}"
        status = "ok" if c.ok else f"DRIFT{': ' + c.error if c.error else ''}"
        lines.append(f"| {c.experiment} | {c.figure} | {c.expected:.4g} | {got} | {drift} | {c.allowed:.4g} | {status} |")
    return "\n".join(lines)
