"""An unhandled error in the ingress: logged server-side with its traceback and a request id; the
client gets a JSON 500 with that id and nothing of the error (issue 22). The bare FastAPI app in
process, no Ray: part of `make test-fast`."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from longrag.config import LongRAGConfig
from serve.api import create_api
from serve.gateway import Gateway
from serve.guard import Guard


def _api():
    """The ingress' real FastAPI app; no deployment behind it (these requests never reach one)."""
    config = LongRAGConfig()
    return create_api(Gateway(config=config), Guard(config, environ={}))


def test_an_unhandled_error_is_logged_with_its_traceback_and_hidden_from_the_client(monkeypatch, caplog):
    def broken_schema():
        raise RuntimeError("db password is hunter2")  # what must never reach a client

    api = _api()
    monkeypatch.setattr(api, "openapi", broken_schema)
    caplog.set_level(logging.ERROR, logger="ray.serve")
    with TestClient(api, raise_server_exceptions=False) as client:
        r = client.get("/openapi.json", headers={"X-Request-ID": "req-123"})
    assert r.status_code == 500
    body = r.json()["error"]
    assert body["code"] == "internal_error" and body["detail"] == {"request_id": "req-123"}
    assert "hunter2" not in r.text and "RuntimeError" not in r.text and "req-123" in body["message"]
    assert r.headers["x-request-id"] == "req-123"
    [record] = [rec for rec in caplog.records if "req-123" in rec.getMessage()]
    assert record.exc_info and "hunter2" in str(record.exc_info[1])  # the traceback is in the server's log


def test_a_request_without_an_id_gets_a_new_one(monkeypatch):
    api = _api()
    monkeypatch.setattr(api, "openapi", lambda: 1 / 0)
    with TestClient(api, raise_server_exceptions=False) as client:
        a, b = client.get("/openapi.json"), client.get("/openapi.json")
    ids = [r.json()["error"]["detail"]["request_id"] for r in (a, b)]
    assert a.status_code == b.status_code == 500 and ids[0] != ids[1] and all(len(i) >= 16 for i in ids)


@pytest.mark.parametrize("declared", [True, False])
def test_an_oversized_body_is_refused_whether_declared_or_chunked(declared):
    body = b'{"question": "' + b"x" * 100_000 + b'"}'
    content = body if declared else iter([body[i:i + 4096] for i in range(0, len(body), 4096)])
    with TestClient(_api()) as client:
        r = client.post("/v1/retrieve", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"


class _OnesEncoder:
    """A query encoder whose vector never matters: the index under test refuses before searching."""

    def encode(self, question):
        import numpy as np

        return np.ones(4, dtype=np.float32)


def _retrieve_over(retriever, mode: str):
    """``POST /v1/retrieve`` in ``mode`` through a gateway over ``retriever`` (called in process)."""
    from serve.gateway import InProcess

    config = LongRAGConfig()
    gw = Gateway(config=config, encoder=InProcess(_OnesEncoder()), retriever=InProcess(retriever))
    with TestClient(create_api(gw, Guard(config, environ={})), raise_server_exceptions=False) as client:
        return client.post("/v1/retrieve", json={"question": "Who wrote Animal Farm?", "mode": mode})


def test_hybrid_on_a_build_without_bm25_is_a_422_that_says_what_to_do():
    """A build written before hybrid retrieval: the index raises LexicalIndexMissing (an InvalidRequest),
    the gateway answers 422 with its message (not a retried 503, not a degraded result)."""
    from longrag.index.lexical import LexicalIndexMissing

    class OldBuild:
        calls = 0

        def retrieve(self, vector, k, text=None):
            OldBuild.calls += 1
            if text is not None:
                raise LexicalIndexMissing("retrieval.mode=hybrid needs the BM25 index of every shard (...): rebuild it")
            raise AssertionError("the dense path is not under test here")

    r = _retrieve_over(OldBuild(), "hybrid")
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert "needs the BM25 index" in error["message"] and "rebuild" in error["message"]
    assert OldBuild.calls == 1  # a client error is not retried


def test_graph_on_a_build_without_its_unit_graph_is_a_422_that_says_what_to_do():
    """A build written before graph expansion: GraphMissing (an InvalidRequest) is a 422 with its
    message, not retried."""
    from longrag.index.graph import GraphMissing

    class OldBuild:
        calls: list = []

        def retrieve(self, vector, k, text=None, graph=False):
            OldBuild.calls.append((text, graph))
            raise GraphMissing("b-old")

    r = _retrieve_over(OldBuild(), "hybrid+graph")
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert "b-old" in message and "unit link graph" in message and "rebuild" in message
    assert OldBuild.calls == [("Who wrote Animal Farm?", True)]
