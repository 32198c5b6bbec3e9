"""Ray's private APIs are used in one place, ``cluster/ray_private.py``, checked against one Ray
version: on another Ray this fails first and names what to re-check; each private name still
resolves; and no other product module names a private Ray module."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

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
