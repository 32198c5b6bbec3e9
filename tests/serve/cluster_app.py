"""The Serve application deployed from ``serve/configs/cpu-cluster.yaml`` (the cluster profile) the way
``make serve`` deploys it, on a Ray with 2 logical CPUs (the 2-core machine the README promises), for
``tests/serve/test_app.py``, which drives it over HTTP (requests, then faults, redeploys, deletion, on
one deployment)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import yaml
from ray import serve

from cluster.local import start_or_join
from serve.run import deploy, wait_healthy, wait_running

APP = "longrag"
CPU_YAML = Path(__file__).resolve().parents[2] / "serve" / "configs" / "cpu-cluster.yaml"
GOOD = ["Who wrote the novel Animal Farm?", "What is the capital of Angola?", "Who composed An American in Paris?",
        "Which spaceflight first landed humans on the Moon?", "Which country is Aruba part of?"]


def app_config(index_uri: str, port: int, reader_cpus: float | None = None) -> dict[str, Any]:
    """cpu-cluster.yaml with the test's build and port, 2 fixed Retriever replicas (health checked every 10 s,
    Serve's default: it re-reads the shards' replica counts then)."""
    config = yaml.safe_load(CPU_YAML.read_text())
    config["http_options"]["port"] = port
    (app,) = config["applications"]
    app["args"]["index"] = index_uri
    app["args"]["overrides"] = [*app["args"].get("overrides", []), "mixpr.max_document_bytes=200000",
                                 "serve.readyz_cache_s=0"]  # the tests read each change at once
    for dep in app["deployments"]:
        if dep["name"] == "Retriever":
            dep.pop("autoscaling_config", None)
            dep.update(num_replicas=2, health_check_period_s=10, health_check_timeout_s=30)
        if dep["name"] == "Reader" and reader_cpus is not None:
            dep["ray_actor_options"] = {"num_cpus": reader_cpus}
    return config


@contextmanager
def deployed(index_uri: str, port: int, dashboard_port: int) -> Iterator[httpx.Client]:
    """A local Ray (dashboard on ``dashboard_port``: the state API needs it) with the app on ``port``,
    healthy, and a client for it; Serve and Ray are shut down after."""
    # Serve reports unschedulable replicas sooner
    with mock.patch.dict(os.environ, {"RAY_SERVE_SLOW_STARTUP_WARNING_S": "10"}):
        handle = start_or_join(None, num_cpus=2, include_dashboard=True, dashboard_port=dashboard_port)
        try:
            deploy(app_config(index_uri, port))
            # schedule_timeout_s: on a loaded machine replicas that are placed but whose workers start
            # slowly are reported "taken more than 10s to be scheduled" (with the free CPUs net of them)
            reason = wait_running([APP], schedule_timeout_s=120, ready_timeout_s=420)
            assert reason is None, reason
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=180) as c:
                wait_healthy(c)
                yield c
        finally:
            serve.shutdown()
            handle.shutdown()


def error_of(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """Every error has one JSON shape: {"error": {"code", "message", "detail"}}."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}, body
    assert body["error"]["code"] == code and body["error"]["message"], body
    return body["error"]
