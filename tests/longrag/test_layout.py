"""The layout rules of the design, checked on the source: the core never imports Ray, no job imports
another, and the jobs stay short CLIs (their logic lives in the core, ``actors/`` and ``serve/``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_JOB_LINES = 320  # "a few hundred lines at most"


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` names anywhere in the file (also inside functions)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_imported_modules_sees_nested_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\ndef f():\n    from jobs import demo\n    import ray.serve\n")
    assert {"os", "jobs", "jobs.demo", "ray.serve"} <= imported_modules(f)


@pytest.mark.parametrize("path", sorted((ROOT / "longrag").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_core_never_imports_ray(path):
    ray_imports = sorted(m for m in imported_modules(path) if m == "ray" or m.startswith("ray."))
    assert not ray_imports, f"{path.relative_to(ROOT)} imports {ray_imports}: Ray belongs in actors/, serve/, jobs/"


JOBS = sorted(p for p in (ROOT / "jobs").glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_no_job_imports_another(path):
    others = sorted(m for m in imported_modules(path) if m == "jobs" or m.startswith("jobs."))
    assert not others, f"jobs/{path.name} imports {others}: shared code goes to the core, actors/ or serve/"


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_jobs_are_short(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_JOB_LINES, f"jobs/{path.name} has {n} lines (at most {MAX_JOB_LINES})"
