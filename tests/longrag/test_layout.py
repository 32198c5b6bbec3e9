"""The layout rules of the design, checked on the source: the core never imports Ray nor a shell
(``actors/``, ``serve/``, ``jobs/``, ``cluster/``), the runtime (the core, ``actors/``, ``serve/``,
``cluster/``) never imports the lab (``lab/``: benchmarks, load, chaos; for jobs and tests), no
import circle between modules or between the core's packages, no job imports another, and the jobs
stay short CLIs (their logic lives in the core, ``actors/`` and ``serve/``).

Import edges count both module-level imports and imports inside functions: a function-level import
only defers the circle to run time, the modules still depend on each other. An edge goes to the most
specific project module named (``from longrag.index import plan`` -> ``longrag.index.plan``; ``from
longrag.eval import QAExample`` -> ``longrag.eval``, whose ``__init__`` imports its modules); importing
``a.b.c`` is not counted as importing the packages ``a`` and ``a.b``."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_JOB_LINES = 300  # jobs are short CLIs: the logic lives in longrag/
CORE = "longrag"
SHELLS = ("actors", "serve", "jobs", "cluster")
LAB = "lab"
RUNTIME = (CORE, "actors", "serve", "cluster")


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


# ------------------------------------------------------------------------------------- import circles
def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path = ROOT, packages: Iterable[str] = (CORE, *SHELLS, LAB)) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def import_edges(name: str, path: Path, modules: dict[str, Path]) -> set[tuple[str, bool]]:
    """``(target, in_function)`` for every project module ``name`` imports (relative imports resolved)."""

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[tuple[str, bool]] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                targets = [resolve(a.name) for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package[: len(package) - child.level + 1] + ([base] if base else []))
                targets = [resolve(f"{base}.{a.name}") for a in child.names]
            else:
                targets = []
            out.update((t, in_function) for t in targets if t and t != name)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False)
    return out


def import_graph(modules: dict[str, Path], *, function_level: bool = True) -> dict[str, set[str]]:
    return {n: {t for t, in_fn in import_edges(n, p, modules) if function_level or not in_fn} for n, p in modules.items()}


def collapse(graph: dict[str, set[str]], unit) -> dict[str, set[str]]:
    """The graph between ``unit(module)`` (e.g. the core's packages); edges inside a unit dropped."""
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        out.setdefault(unit(a), set()).update(unit(b) for b in targets if unit(b) != unit(a))
    return out


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's circles: its strongly connected components of more than one node (or a node that
    imports itself), each sorted; Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    nodes = sorted(set(graph) | {t for ts in graph.values() for t in ts})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    circles.append(sorted(component))
    return sorted(circles)


def core_package(module: str) -> str:
    """``longrag.index.plan`` -> ``longrag.index``; a shell module stays itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == CORE else module


def _describe(graph: dict[str, set[str]], circles: list[list[str]]) -> str:
    return "; ".join(" ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c) for c in circles)


def test_import_circles_matches_networkx_on_synthetic_graphs():
    import random

    import networkx as nx

    hand = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": {"g"}, "h": set()}
    assert import_circles(hand) == [["a", "b", "c"], ["d", "e"], ["g"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []  # a chain is no circle
    rng = random.Random(0)
    for trial in range(200):
        n = rng.randint(1, 30)
        graph = {str(i): {str(j) for j in range(n) if rng.random() < 2.0 / n} for i in range(n)}
        g = nx.DiGraph([(a, b) for a, ts in graph.items() for b in ts])
        g.add_nodes_from(graph)
        # a node is on a circle exactly when networkx finds an elementary cycle through it
        on_cycle = {v for cycle in nx.simple_cycles(g) for v in cycle}
        assert {v for c in import_circles(graph) for v in c} == on_cycle, trial
        assert import_circles(graph) == sorted(sorted(c) for c in nx.strongly_connected_components(g)
                                               if len(c) > 1 or g.has_edge(next(iter(c)), next(iter(c)))), trial


def test_import_graph_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "sub/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("import pkg.a\n")
    modules = project_modules(tmp_path, ["pkg"])
    assert import_circles(import_graph(modules)) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    assert import_circles(import_graph(modules, function_level=False)) == []
    assert import_circles(collapse(import_graph(modules), lambda m: ".".join(m.split(".")[:2]))) == [["pkg.a", "pkg.sub"]]


MODULES = project_modules()
GRAPH = import_graph(MODULES)


def test_no_import_circle_between_modules():
    circles = import_circles(GRAPH)
    assert not circles, f"import circles (module- and function-level imports): {_describe(GRAPH, circles)}"


def test_no_import_circle_between_core_packages():
    packages = collapse(GRAPH, core_package)
    circles = import_circles(packages)
    assert not circles, f"import circles between packages: {_describe(packages, circles)}"


def test_the_core_imports_no_shell():
    bad = sorted(f"{a} -> {b}" for a, ts in GRAPH.items() if a.split(".")[0] == CORE
                 for b in ts if b.split(".")[0] in SHELLS)
    assert not bad, f"the core imports the shell: {bad}"


def test_the_runtime_never_imports_the_lab():
    bad = sorted(f"{a} -> {b}" for a, ts in GRAPH.items() if a.split(".")[0] in RUNTIME
                 for b in ts if b.split(".")[0] == LAB)
    assert not bad, f"the runtime imports the lab (benchmarks belong to jobs and tests): {bad}"


def test_the_lab_is_imported_by_jobs_and_tests_only():
    """Who imports the lab, among the project's modules: jobs and the lab itself (tests are not
    project modules here; they may import it too)."""
    users = {a.split(".")[0] for a, ts in GRAPH.items() for b in ts if b.split(".")[0] == LAB}
    assert users and users <= {"jobs", LAB}, sorted(users)


BENCH_CLI = ROOT / LAB / "bench" / "cli"  # the benchmarks `longrag bench <name>` runs (jobs/bench.py)


def module_level_imports(path: Path) -> set[str]:
    """The modules named by imports that run when ``path`` is imported (not inside a function)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                names.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names.add(child.module)
            visit(child)

    visit(tree)
    return names


def _ray(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m == "ray" or m.startswith("ray."))


@pytest.mark.parametrize("path", sorted((ROOT / LAB).rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_lab_never_imports_ray(path):
    """The lab's modules are Ray-free like the core, so a test of a benchmark's logic needs no
    cluster. The benchmarks themselves (``lab/bench/cli/``, each the CLI ``longrag bench <name>``
    runs) may start one, as the jobs do, but import Ray only inside the function that does: importing
    any of them (``--help``, a test of its helpers) still needs no Ray."""
    if BENCH_CLI in path.parents:
        ray_imports = _ray(module_level_imports(path))
        assert not ray_imports, f"{path.relative_to(ROOT)} imports {ray_imports} at module level"
    else:
        ray_imports = _ray(imported_modules(path))
        assert not ray_imports, f"{path.relative_to(ROOT)} imports {ray_imports}"


def test_module_level_imports_skip_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\nif True:\n    import json\ndef f():\n    import ray\n    from ray import serve\n"
                 "class C:\n    def g(self):\n        import ray.data\n")
    assert module_level_imports(f) == {"os", "json"}
    assert {"ray", "ray.data"} <= imported_modules(f)
