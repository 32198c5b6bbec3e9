"""Rerun the reproductions of the tables in docs/ and fail on a drift: one YAML per experiment in ``repro/``.

    python -m jobs.regress --list                 # experiments, slow or not, minutes each
    python -m jobs.regress --fast                 # every experiment not marked slow
    python -m jobs.regress --only mixpr-formats   # one (repeat --only, or comma-separate)
    python -m jobs.regress                        # everything, the reader runs with the real LLM included

Each experiment's command runs in a fresh output folder (``--work``/NAME, its ``{out}``) from the
repository root; its result JSON is checked figure by figure (:mod:`longrag.eval.regress`). Prints
a table of every figure, writes ``--work``/regress.json, and exits 1 when a figure drifts beyond
its tolerance or a command fails (the table of drifts is printed last), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from longrag.cli import job_setup
from longrag.eval.regress import Experiment, FigureCheck, check, drift_table, failed, load_experiments, result_json

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.regress", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these experiments")
    p.add_argument("--fast", action="store_true", help="skip the experiments marked slow")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--dir", default=str(ROOT / "repro"), help="folder of experiment YAMLs")
    p.add_argument("--work", default="reports/regress", help="output folder of the runs")
    return p.parse_args(argv)


def run_one(exp: Experiment, work: Path) -> tuple[list[FigureCheck], float]:
    out = work / exp.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = exp.argv(out.resolve(), sys.executable)
    print(f"== {exp.name}: {' '.join(argv)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=exp.timeout_s)
    except subprocess.TimeoutExpired:
        return failed(exp, f"timed out after {exp.timeout_s:g} s"), time.perf_counter() - t0
    wall = time.perf_counter() - t0
    (out / "stdout.txt").write_text(proc.stdout)
    (out / "stderr.txt").write_text(proc.stderr)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return failed(exp, f"exit {proc.returncode}: {tail[0][:200]}"), wall
    try:
        return check(exp, result_json(exp, proc.stdout, out)), wall
    except ValueError as exc:
        return failed(exp, str(exc)), wall


def main(argv: list[str] | None = None) -> int:
    job_setup()
    args = parse_args(argv)
    only = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    try:
        exps = load_experiments(args.dir, only or None)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for e in exps:
            speed = "slow" if e.slow else "fast"
            print(f"{e.name:34} {speed:4} ~{e.minutes or 0:g} min  {len(e.figures):3} figures  {e.title}")
        return 0
    if args.fast:
        exps = [e for e in exps if not e.slow]
    if not exps:
        print("error: no experiment selected", file=sys.stderr)
        return 2
    work = Path(args.work)
    checks: list[FigureCheck] = []
    walls: dict[str, float] = {}
    for exp in exps:
        got, walls[exp.name] = run_one(exp, work)
        checks += got
        bad = sum(not c.ok for c in got)
        print(f"== {exp.name}: {len(got) - bad}/{len(got)} figures within tolerance ({walls[exp.name]:.0f} s)",
              file=sys.stderr, flush=True)
    print(drift_table(checks))
    drifts = [c for c in checks if not c.ok]
    work.mkdir(parents=True, exist_ok=True)
    (work / "regress.json").write_text(json.dumps(
        {"experiments": [e.name for e in exps], "wall_s": {k: round(v, 1) for k, v in walls.items()},
         "checks": [c.model_dump() for c in checks], "drifts": len(drifts)}, indent=2))
    if drifts:
        print(f"\n{len(drifts)} of {len(checks)} figures drifted beyond their tolerance:\n")
        print(drift_table(drifts))
        return 1
    print(f"\nall {len(checks)} figures of {len(exps)} experiment(s) reproduced within their tolerances")
    return 0


if __name__ == "__main__":
    sys.exit(main())
