"""The probes of the ingress (issue 32): ``/livez`` asks nothing behind the ingress, ``/readyz``
builds its report at most once per ``serve.readyz_cache_s`` (one build for concurrent probes), a
shard without a live replica is 503 with the shard named, ``/healthz`` is ``/readyz`` under its old
name, and all three need no API key but are rate-limited by address. The real FastAPI app over
counting fake handles, in process, no Ray (``make test-fast``)."""

from __future__ import annotations

import asyncio
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


def test_a_shard_without_a_live_replica_is_503_with_the_shard_named():
    api, _ = _fixture(live=(2, 0))
    with TestClient(api) as client:
        r = client.get("/readyz")
    assert r.status_code == 503
    err = r.json()["error"]
    assert "shard 1: no live replica" in err["message"] and err["detail"]["status"] == "unavailable"
    assert err["detail"]["redundancy"] == "shard 0: 2 of 2 replicas; shard 1: 0 of 2 replicas"


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
