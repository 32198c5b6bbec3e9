"""The probes of the ingress (issue 32): ``/livez`` asks nothing behind the ingress, ``/readyz``
builds its report at most once per ``serve.readyz_cache_s`` (one build for concurrent probes), a
shard without a live replica is 503 with the shard named, ``/healthz`` is ``/readyz`` under its old
name, and all three need no API key but are rate-limited by address. The real FastAPI app over
counting fake handles, in process, no Ray (``make test-fast``)."""

from __future__ import annotations

import asyncio
import logging
import threading
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from longrag.config import load_config
from longrag.types import ShardRedundancy
from serve.api import create_api
from serve.gateway import Gateway
from serve.guard import Guard
from serve.routes import health
from serve.schemas import IndexDescription, LLMDescription


class _Method:
    """``handle.describe.remote()``: an awaitable answer, each call counted."""

    def __init__(self, answer, delay_s: float = 0.0) -> None:
        self.answer, self.delay_s, self.calls = answer, delay_s, 0
        self._lock = threading.Lock()

    def remote(self):
        with self._lock:
            self.calls += 1

        async def call():
            await asyncio.sleep(self.delay_s)
            return self.answer() if callable(self.answer) else self.answer
        return call()


def _fixture(live=(2, 2), delay_s=0.0, **overrides):
    rows = lambda: [ShardRedundancy(shard=i, live=n, replicas=2) for i, n in enumerate(live)]  # noqa: E731
    index = _Method(lambda: IndexDescription(build_id="b1", shards=len(live), units=10, chunks=20,
                                             embedding_model="minilm", index=rows()), delay_s)
    llm = _Method(LLMDescription(name="fake", context_window=4096))
    sets = [f"serve.{k}={v}" for k, v in overrides.items()]
    config = load_config(None, sets)
    gw = Gateway(config=config, retriever=SimpleNamespace(describe=index), llm=SimpleNamespace(describe=llm),
                 app_name=None)
    return create_api(gw, Guard(config, environ={})), index


@pytest.fixture(autouse=True)
def _no_serve(monkeypatch):
    """No Serve controller here: serve.status() answers with no application."""
    monkeypatch.setattr(health, "serve_status", lambda: SimpleNamespace(applications={}))


def test_livez_asks_nothing_behind_the_ingress():
    api, index = _fixture()
    with TestClient(api) as client:
        r = client.get("/livez")
    assert r.status_code == 200 and r.json()["status"] == "ok" and index.calls == 0


def test_readyz_is_built_once_per_period_and_healthz_is_the_same_report():
    api, index = _fixture(readyz_cache_s=60)
    with TestClient(api) as client:
        first = client.get("/readyz")
        again = client.get("/readyz")
        old = client.get("/healthz")
    assert first.status_code == again.status_code == old.status_code == 200
    body = first.json()
    assert body["status"] == "ok" and body["build_id"] == "b1" and body["redundancy"].count("2 of 2") == 2
    assert index.calls == 1  # the second probe and /healthz got the cached report
    assert again.json()["age_s"] >= 0 and old.json()["build_id"] == "b1"
    assert api.openapi()["paths"]["/healthz"]["get"].get("deprecated") is True


def test_readyz_is_rebuilt_once_stale():
    api, index = _fixture(readyz_cache_s=0)
    with TestClient(api) as client:
        for _ in range(3):
            assert client.get("/readyz").status_code == 200
    assert index.calls == 3


def test_concurrent_probes_share_one_build():
    api, index = _fixture(delay_s=0.2, readyz_cache_s=60)

    async def probe_10():
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
            return await asyncio.gather(*(client.get("/readyz") for _ in range(10)))

    answers = asyncio.run(probe_10())
    assert [r.status_code for r in answers] == [200] * 10 and index.calls == 1


def test_a_shard_without_a_live_replica_is_ready_with_the_shard_named():
    """Issue 40, item 3: a shard with no live replica is the cluster's state, not this pod's: every
    worker group's readinessProbe is /readyz, and a 503 here would take every pod out of the
    Service. The probe stays 200; the report says degraded and names the shard."""
    api, _ = _fixture(live=(2, 0))
    with TestClient(api) as client:
        r = client.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "degraded" and "shard 1: no live replica" in body["problems"], body
    assert body["redundancy"] == "shard 0: 2 of 2 replicas; shard 1: 0 of 2 replicas"


def _app_status(**deployments):
    """``serve.status()`` with the app ``longrag`` and its deployments ``name=(status, running, message)``."""
    return SimpleNamespace(applications={"longrag": SimpleNamespace(deployments={
        name: SimpleNamespace(status=status, replica_states={"RUNNING": running} if running else {"STARTING": 1},
                              message=message)
        for name, (status, running, message) in deployments.items()})})


SERVE_MESSAGE = "Deployment 'LLMServer' in application 'longrag' has 1 replicas that have taken more than 30s " \
                "to be scheduled: Resources required for each replica: {'CPU': 3.0}, node 10.1.2.3"


def _with_app(monkeypatch, status, **fixture):
    monkeypatch.setattr(health, "serve_status", lambda: status)
    monkeypatch.setattr(health, "placement", lambda: None)
    monkeypatch.setattr(health, "missing_resources", lambda app, name, where: {"CPU": 3.0})
    api, index = _fixture(**fixture)
    api.state.gateway.app_name = "longrag"
    return api, index


def test_a_deployment_down_elsewhere_is_reported_not_a_503(monkeypatch):
    """The LLM deployment without a running replica (it waits for 3 CPUs): retrieval still answers,
    so the pod stays ready; the report names the deployment, its missing resources and Serve's reason."""
    api, _ = _with_app(monkeypatch, _app_status(LLMServer=("UNHEALTHY", 0, SERVE_MESSAGE),
                                                QueryEncoder=("HEALTHY", 1, ""), Retriever=("HEALTHY", 1, "")))
    with TestClient(api) as client:
        r = client.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "degraded" and body["deployments"]["LLMServer"]["missing_resources"] == {"CPU": 3.0}
    assert any(p.startswith("LLMServer: UNHEALTHY, 0 running") for p in body["problems"]), body


def test_readiness_fails_on_the_pods_own_request_path(monkeypatch):
    """503 only when this ingress cannot answer: its query encoder has no running replica, or no build
    is loaded (the Retriever does not describe one)."""
    api, _ = _with_app(monkeypatch, _app_status(QueryEncoder=("UNHEALTHY", 0, ""), Retriever=("HEALTHY", 1, "")))
    with TestClient(api) as client:
        r = client.get("/readyz")
    assert r.status_code == 503 and "QueryEncoder" in r.json()["error"]["message"], r.text

    def no_build():
        raise RuntimeError("the Retriever failed to load secret-build-7f3a")

    monkeypatch.setattr(health, "serve_status", lambda: SimpleNamespace(applications={}))
    api, _ = _fixture()
    api.state.gateway.retriever.describe.answer = no_build
    with TestClient(api) as client:
        r = client.get("/readyz")
    err = r.json()["error"]
    assert r.status_code == 503 and "no build loaded" in err["message"], r.text
    assert err["detail"]["status"] == "unavailable"


def test_readyz_without_a_key_shows_no_error_text_nor_serves_messages(monkeypatch, caplog):
    """Issue 40, item 4's last sentence: /readyz needs no key, so what it says to anyone must not
    carry an exception's text (logged with its traceback instead) nor Serve's own messages (node
    addresses, resources); with a key, Serve's messages are there for the operator, an exception's
    text still is not."""
    api, _ = _with_app(monkeypatch, _app_status(Reader=("UNHEALTHY", 0, SERVE_MESSAGE), LLMServer=("HEALTHY", 1, ""),
                                                QueryEncoder=("HEALTHY", 1, ""), Retriever=("HEALTHY", 1, "")),
                       api_keys="[secret-key]")

    def broken():
        raise RuntimeError("boom at secret-path-7f3a")

    api.state.gateway.llm.describe.answer = broken
    serve_log = logging.getLogger("ray.serve")  # Serve's replica logger does not propagate: listen on it
    serve_log.addHandler(caplog.handler)
    try:
        with TestClient(api) as client:
            bare = client.get("/readyz")
            keyed = client.get("/readyz", headers={"Authorization": "Bearer secret-key"})
    finally:
        serve_log.removeHandler(caplog.handler)
    assert bare.status_code == keyed.status_code == 200, (bare.text, keyed.text)
    for secret in ("secret-path-7f3a", "boom", "10.1.2.3", "Resources required"):
        assert secret not in bare.text, (secret, bare.text)
    assert "secret-path-7f3a" not in keyed.text and "boom" not in keyed.text, keyed.text
    assert keyed.json()["deployments"]["Reader"]["message"] == SERVE_MESSAGE
    assert bare.json()["deployments"]["Reader"] == {"status": "UNHEALTHY", "running_replicas": 0, "message": "",
                                                    "missing_resources": None}  # named, without Serve's words
    assert "LLMServer.describe failed" in " ".join(bare.json()["problems"])
    assert any("boom at secret-path-7f3a" in (r.exc_text or "") for r in caplog.records), \
        "the describe error is not logged with its traceback"


class _Recorded:
    """Metrics that remember what the health report set."""

    def __init__(self) -> None:
        self.reports = []

    def health(self, report) -> None:
        self.reports.append(report)

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_the_cluster_state_goes_to_the_metrics():
    api, _ = _fixture(live=(2, 0))
    api.state.gateway.metrics = metrics = _Recorded()
    with TestClient(api) as client:
        assert client.get("/readyz").status_code == 200
    (report,) = metrics.reports
    assert [(r.shard, r.live) for r in report.index] == [(0, 2), (1, 0)]


def test_a_missing_replica_is_degraded_but_ready():
    api, _ = _fixture(live=(1, 2))
    with TestClient(api) as client:
        r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "degraded"
    assert "shard 0: 1 of 2 replicas live" in r.json()["problems"]


def test_probes_need_no_key_but_are_rate_limited_by_address():
    api, index = _fixture(api_keys="[secret-key]", rate_limit_rps=0.01, rate_limit_burst=2, readyz_cache_s=60)
    with TestClient(api) as client:
        assert client.post("/v1/retrieve", json={"question": "q"}).status_code == 401  # the API needs the key
        codes = [client.get(p).status_code for p in ("/livez", "/readyz", "/healthz")]
    assert codes[:2] == [200, 200] and codes[2] == 429  # a burst of 2 from this address, then Retry-After
    assert index.calls == 1


def test_a_slow_describe_answers_from_the_last_report_marked_stale(monkeypatch):
    """Issue 44 item 3.5: the Retriever's describe reads Serve's status; on a slow controller it takes
    longer than DESCRIBE_TIMEOUT_S. The build is still loaded: /readyz stays 200 with the Retriever's
    last answer, marked stale with its age, instead of a 503 "no build loaded". Without any earlier
    answer there is nothing to show: 503 as before."""
    monkeypatch.setattr(health, "DESCRIBE_TIMEOUT_S", 0.2)
    api, index = _fixture(readyz_cache_s=0)
    with TestClient(api) as client:
        index.delay_s = 0.5  # no answer yet, and this one times out
        first = client.get("/readyz")
        assert first.status_code == 503 and "no build loaded" in first.json()["error"]["message"], first.text
        index.delay_s = 0.0
        fresh = client.get("/readyz")
        assert fresh.status_code == 200 and fresh.json()["described_age_s"] is None, fresh.text
        index.delay_s = 0.5  # the controller is slow now
        slow = client.get("/readyz")
    assert slow.status_code == 200, slow.text
    body = slow.json()
    assert body["build_id"] == "b1" and body["redundancy"].count("2 of 2") == 2, body
    assert body["described_age_s"] is not None and 0 <= body["described_age_s"] < 5, body
    assert body["status"] == "degraded", body
    assert any("Retriever.describe timed out" in p and "stale" in p for p in body["problems"]), body
    assert index.calls == 3
