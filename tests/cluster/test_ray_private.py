"""Ray's private APIs are used in one place, ``cluster/ray_private.py``, checked against one Ray
version: on another Ray this fails first and names what to re-check; each private name still
resolves; and no other product module names a private Ray module."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import ray

from cluster import ray_private

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("longrag", "actors", "serve", "jobs", "cluster")
PRIVATE = re.compile(r"\bray\.(?:[a-z_]+\.)*_[a-z]\w*|from ray\.experimental|import ray\.experimental")


def test_the_wrappers_were_checked_against_this_ray():
    assert ray.__version__ == ray_private.CHECKED_RAY, (
        f"Ray {ray.__version__} is not the {ray_private.CHECKED_RAY} cluster/ray_private.py was checked against: "
        "re-check each wrapper there against the new Ray, then update CHECKED_RAY")


@pytest.mark.parametrize("module, name", ray_private.PRIVATE_NAMES, ids=lambda x: str(x))
def test_every_private_name_resolves(module, name):
    assert hasattr(importlib.import_module(module), name), f"{module}.{name} is gone in Ray {ray.__version__}"


def test_the_wrapped_state_calls_exist():
    from ray._private import state

    for call in ("get_max_resources_from_cluster_config", "actor_table"):
        assert callable(getattr(state.state, call, None)), call
    from ray.serve import api

    assert "_blocking" in inspect.signature(api._run).parameters  # serve_run_nowait's keyword


@pytest.mark.parametrize("module, name, keyword", ray_private.PRIVATE_KEYWORDS, ids=lambda x: str(x))
def test_every_private_keyword_is_still_taken(module, name, keyword):
    """The private keyword arguments ray_private.py passes (``_blocking=False``: submit, do not wait)."""
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    assert keyword in inspect.signature(target).parameters, (
        f"{module}.{name} takes no {keyword} in Ray {ray.__version__}")


def test_no_other_module_uses_a_private_ray_api():
    offenders = []
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name == "ray_private.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#")[0]
                if "``" in code or code.strip().startswith(("*", '"')):
                    continue  # a docstring naming what the wrapper wraps
                if PRIVATE.search(code):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "private Ray APIs outside cluster/ray_private.py:\n" + "\n".join(offenders)


def test_the_offender_check_sees_a_private_import():
    assert PRIVATE.search("from ray.serve._private import api")
    assert PRIVATE.search("x = ray._private.state.state")
    assert not PRIVATE.search("from ray.serve.config import gRPCOptions")


# ------------------------------------------------------------------ the import graph, read as code (AST)
#: Ray modules that are private as a whole, and names that are private wherever they are imported from.
PRIVATE_MODULES = ("ray._private", "ray._raylet", "ray.core.generated", "ray.autoscaler.v2", "ray.experimental")
PRIVATE_NAMES_ANYWHERE = ("_get_global_client", "_get_serve_request_context")


def _root(node: Any) -> str | None:
    """The name an attribute chain, subscript or call starts from (``client`` of ``client.x.y(...)``)."""
    import ast

    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Await)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _ray_names(tree: Any) -> tuple[set[str], set[str]]:
    """The names of ``tree`` bound to Ray: those imported from ``ray`` (``ray``, ``serve``, ``api``
    ...), and those assigned from a call on one of them or on ``ray_private`` (``client =
    ray_private.serve_start(...)``, ``handle = serve.get_deployment_handle(...)``), transitively."""
    import ast

    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "ray"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "ray":
                imported |= {a.asname or a.name for a in node.names}
            elif node.module == "cluster":
                imported |= {a.asname or a.name for a in node.names if a.name == "ray_private"}
    assigns = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
    derived: set[str] = set()
    while True:
        known = imported | derived
        more = {t.id for n in assigns if isinstance(n.value, (ast.Call, ast.Await)) and _root(n.value) in known
                for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
                for t in ast.walk(target) if isinstance(t, ast.Name)} - known
        if not more:
            break
        derived |= more
    return imported - {"ray_private"}, derived


def _private_imports(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of every private Ray name ``source`` imports or reaches: a module under
    :data:`PRIVATE_MODULES` or with a ``_`` part (``ray.serve._private``), a name starting with ``_``
    imported from ``ray.*``, a name of :data:`PRIVATE_NAMES_ANYWHERE`, an attribute chain
    ``ray.x._y`` in code, or a call of a Ray API (on a name :func:`_ray_names` binds to Ray) with a
    keyword argument starting with ``_`` (``serve.delete(app, _blocking=False)``)."""
    import ast

    def private_module(name: str) -> bool:
        return name.split(".")[0] == "ray" and (
            any(name == m or name.startswith(m + ".") for m in PRIVATE_MODULES)
            or any(part.startswith("_") for part in name.split(".")))

    found = []
    tree = ast.parse(source)
    imported, derived = _ray_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _root(node.func) in imported | derived:
            found += [(node.lineno, f"{ast.unparse(node.func)}({k.arg}=...)") for k in node.keywords
                      if k.arg and k.arg.startswith("_")]
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if private_module(node.module):
                found.append((node.lineno, node.module))
            elif node.module.split(".")[0] == "ray":
                found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                          if a.name.startswith("_") or a.name in PRIVATE_NAMES_ANYWHERE]
        elif isinstance(node, ast.Attribute):
            chain, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "ray":
                dotted = ".".join(["ray", *reversed(chain)])
                if private_module(dotted) or node.attr in PRIVATE_NAMES_ANYWHERE:
                    found.append((node.lineno, dotted))
        elif isinstance(node, ast.Name) and node.id in PRIVATE_NAMES_ANYWHERE:
            found.append((node.lineno, node.id))
    return sorted(set(found))


def test_no_module_but_ray_private_imports_a_private_ray_name():
    """Issue 40, item 7: every private Ray name goes through cluster/ray_private.py (its names are
    pinned to Ray's version above); an AST scan of every product module, docstrings left aside."""
    offenders = []
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.relative_to(ROOT).as_posix() == "cluster/ray_private.py":
                continue
            offenders += [f"{path.relative_to(ROOT)}:{n}: {what}"
                          for n, what in _private_imports(path.read_text(encoding="utf-8"))]
    assert not offenders, "private Ray names outside cluster/ray_private.py:\n" + "\n".join(offenders)


def test_the_ast_scan_sees_each_kind_of_private_import():
    assert _private_imports("from ray.serve.context import _get_global_client")
    assert _private_imports("from ray.serve.context import _get_serve_request_context as f")
    assert _private_imports("from ray.core.generated import autoscaler_pb2")
    assert _private_imports("from ray.autoscaler.v2.sdk import get_cluster_status")
    assert _private_imports("import ray._private.state")
    assert _private_imports("from ray.serve._private import api")
    assert _private_imports("import ray\nx = ray._private.state.state")
    assert _private_imports("from ray.serve import api\napi._run(app)") == []  # a module's attribute: not by name
    assert _private_imports("from ray.experimental.internal_kv import _internal_kv_put")
    assert not _private_imports("from ray.serve.config import gRPCOptions\nimport ray.util\n'''ray._private'''")
    # a private keyword argument to a Ray API: on a name imported from ray, or on what one returned
    assert _private_imports("from ray import serve\nserve.delete(app, _blocking=False)")
    assert _private_imports("import ray\nray.get(ref, _timeout=1)")
    assert _private_imports("from cluster import ray_private\nclient = ray_private.serve_start()\n"
                            "client.deploy_apps(schema, _blocking=False)")
    assert _private_imports("from ray import serve\nh = serve.get_deployment_handle('d')\nh2 = h.options()\n"
                            "h2.search.remote(q, _internal=True)")
    assert not _private_imports("from ray import serve\nserve.delete(app)\nmine(x, _private_kw=1)\n"
                                "from cluster import ray_private\nray_private.serve_delete_nowait(app)")


def test_the_serve_runtime_does_not_import_the_cli():
    """serve/run.py is the CLI (``python -m serve.run``); the runtime (routes, deployments, the index
    application) reads Serve's status through serve/status.py and never imports the CLI module."""
    import ast

    offenders = []
    for path in sorted((ROOT / "serve").rglob("*.py")):
        if path.name == "run.py" and path.parent == ROOT / "serve":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n == "serve.run"]
    assert not offenders, "the Serve runtime imports the CLI module serve.run:\n" + "\n".join(offenders)
