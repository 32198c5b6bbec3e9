"""The Serve application over HTTP: 200s with evidence and trace, 4xx for bad requests, and one
question answered end to end by the real bundled models (MiniLM + SmolLM2 via llama.cpp)."""

from __future__ import annotations

import time

import httpx
import pytest
from ray import serve

from cluster.local import start_or_join
from serve.app import AppArgs, app_builder

PORT = 8123


@pytest.fixture(scope="module")
def client(sample_index):
    handle = start_or_join(None, num_cpus=4)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(app_builder(AppArgs(index=sample_index["uri"],
                                  overrides=["index.replicas=2", "mixpr.max_document_bytes=200000"])),
              name="longrag", route_prefix="/", blocking=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=180) as c:
        deadline = time.time() + 240
        while True:
            try:
                if c.get("/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise TimeoutError("Serve app not healthy")
            time.sleep(1)
        yield c
    serve.shutdown()
    handle.shutdown()


def test_healthz_describes_the_build(client, sample_index):
    body = client.get("/healthz").json()
    assert body["status"] == "ok"
    assert body["build_id"] == sample_index["report"]["build_id"]
    assert body["shards"] == 2 and body["units"] == sample_index["report"]["counts"]["units"]
    assert body["chunks"] == sample_index["report"]["counts"]["chunks"]


def test_retrieve_returns_ranked_units_with_best_chunks(client):
    r = client.post("/v1/retrieve", json={"question": "Who wrote the novel Animal Farm?", "k": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["k"] == 3 and len(body["units"]) == 3
    scores = [u["score"] for u in body["units"]]
    assert scores == sorted(scores, reverse=True)
    assert "Animal Farm" in body["units"][0]["titles"]
    assert body["units"][0]["best_chunk"]
    assert body["coverage"] == {**body["coverage"], "shards": 2, "answered": 2, "degraded": False}
    assert body["trace"]["encode_ms"] > 0 and body["trace"]["retrieve_ms"] > 0


def test_answer_end_to_end_with_the_real_bundled_llm(client):
    r = client.post("/v1/answer", json={"question": "Who wrote the novel Animal Farm?", "k": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"].strip()
    assert body["long_answer"].strip()
    assert "orwell" in (body["answer"] + " " + body["long_answer"]).lower()
    assert body["evidence"] and any(ev["used"] for ev in body["evidence"])
    assert any("Animal Farm" in ev["titles"] for ev in body["evidence"])
    trace = body["trace"]
    assert trace["prompt_tokens"] > 0 and trace["completion_tokens"] > 0
    for stage in ("encode_ms", "retrieve_ms", "read_ms", "total_ms"):
        assert trace[stage] > 0
    assert body["coverage"]["degraded"] is False


@pytest.mark.parametrize(
    "payload, fragment",
    [
        ({"question": "", "k": 3}, "empty"),
        ({"question": "   ", "k": 3}, "empty"),
        ({"question": "x" * 5000, "k": 3}, "limit"),
        ({"question": "Who?", "k": 0}, "k must be"),
        ({"question": "Who?", "k": 10_000}, "k must be"),
        ({"k": 3}, "question"),
        ({"question": "Who?", "k": "many"}, "k"),
        ({"question": "Who?", "colour": "blue"}, "colour"),
    ],
)
def test_bad_requests_get_422_with_a_message(client, payload, fragment):
    for path in ("/v1/retrieve", "/v1/answer"):
        r = client.post(path, json=payload)
        assert r.status_code == 422, (path, r.status_code, r.text)
        assert fragment in r.text


def test_malformed_json_and_wrong_method(client):
    r = client.post("/v1/answer", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.text
    assert client.get("/v1/answer").status_code == 405
    assert client.get("/openapi.json").status_code == 200


def _hashhop(tokens=3000, hops=2, seed=0):
    from longrag.synthetic import generate_hashhop

    return generate_hashhop(tokens, hops, seed)


def test_longcontext_retrieves_in_document_order(client):
    sample = _hashhop()
    r = client.post("/v1/longcontext", json={"document": sample.document, "question": sample.question,
                                              "retriever": "mixpr", "k": 10, "route": "local",
                                              "retrieve_only": True})
    assert r.status_code == 200, r.text
    body = r.json()
    positions = [c["position"] for c in body["chunks"]]
    assert len(positions) == 10 and positions == sorted(positions)
    assert body["route"] == "local" and body["answer"] is None
    assert body["trace"]["n_chunks"] > 10


def test_longcontext_answers_with_the_real_llm(client):
    sample = _hashhop(tokens=600)
    r = client.post("/v1/longcontext", json={"document": sample.document, "question": sample.question,
                                              "retriever": "sparse", "k": 8, "route": "local"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] and body["trace"]["prompt_tokens"] > 0


def test_longcontext_rejects_oversized_and_bad_requests(client):
    r = client.post("/v1/longcontext", json={"document": "word " * 60_000, "retriever": "mixpr", "k": 5})
    assert r.status_code == 413 and "limit" in r.text
    r = client.post("/v1/longcontext", json={"document": "   ", "retriever": "mixpr", "k": 5})
    assert r.status_code == 422
    r = client.post("/v1/longcontext", json={"document": "A text.", "retriever": "bm25", "k": 5})
    assert r.status_code == 422
