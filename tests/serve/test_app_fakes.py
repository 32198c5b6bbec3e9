"""The Serve layer with fakes, fast (part of `make test-fast`): the real deployments, ingress and
``ShardedIndex`` over injected backends (``tests/fakes.py``: a hashing encoder, in-process shards
of a tiny build, a scripted reader LLM), on one local Ray + Serve started once for the module.
The same app with the real models runs in ``tests/serve/test_app.py``."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray
from ray import serve

from cluster.local import WORKER_ENV
from longrag.config import LongRAGConfig
from serve.app import build_app, llm_router_options
from serve.deployments import LLMServer
from tests.fakes import FakeShardsIndex, HashEncoder, ReplicaNamer, TitleReader, write_tiny_build

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
PORT = 8210
DOCS = [
    ("Animal Farm", "Animal Farm is a novel by George Orwell. It was published in 1945."),
    ("Luanda", "Luanda is the capital of Angola. It lies on the Atlantic coast."),
    ("Apollo 11", "Apollo 11 was the first spaceflight to land humans on the Moon in 1969."),
    ("Aruba", "Aruba is a country within the Kingdom of the Netherlands."),
    ("George Gershwin", "George Gershwin composed An American in Paris and Rhapsody in Blue."),
]


LINKS = [(1, 4), (2, 3)]  # Luanda - George Gershwin, Apollo 11 - Aruba: the unit link graph (mode=graph)
KEY, OTHER_KEY = "test-key-a", "test-key-b"  # the app's API keys (OTHER_KEY: the rate-limit test's own bucket)
AUTH = {"Authorization": f"Bearer {KEY}"}
METRICS_PORT = 8211
ORIGIN = "http://playground.example"


def _deploy(build: str, name: str, route_prefix: str, *, index_cls: Any, overrides: tuple[str, ...] = ()) -> None:
    cfg = LongRAGConfig().with_overrides([
        "index.replicas=2", f"serve.api_keys=[{KEY}, {OTHER_KEY}]", "serve.rate_limit_rps=2",
        "serve.rate_limit_burst=30", "serve.readyz_cache_s=0", f"serve.cors_origins=[{ORIGIN}]",
        "retrieval.graph_depth=2", "retrieval.graph_seeds=1", *overrides,
    ])
    app = build_app(cfg, build, encoder_cls=HashEncoder, index_cls=index_cls, engine_cls=TitleReader)
    serve.run(app, name=name, route_prefix=route_prefix, blocking=False)


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> str:
    return write_tiny_build(tmp_path_factory.mktemp("tiny") / "build", DOCS, shards=2, links=LINKS)


@pytest.fixture(scope="module")
def client(build):
    # tests.fakes must import in the replicas: the repository root on their path. Metrics are
    # exported on METRICS_PORT every second (Ray's default is every 10 s).
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=4, include_dashboard=False, namespace="longrag",
             runtime_env={"env_vars": {**WORKER_ENV, "PYTHONPATH": path}},
             _metrics_export_port=METRICS_PORT, _system_config={"metrics_report_interval_ms": 1000})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": PORT})
        _deploy(build, "longrag", "/", index_cls=FakeShardsIndex.with_dead((1, 0)),
                overrides=("retrieval.document_order=stored",))
        # The single-machine profile beside it: encoder and index in the Ingress (the real
        # InProcessIndex over the same build), no QueryEncoder/Retriever deployments.
        _deploy(build, "longrag-local", "/local", index_cls=None,
                overrides=("serve.colocate=true", "retrieval.document_order=packed"))
        # Both replicas of shard 1 gone (issue 40, item 3): the pod stays ready, the answers degraded.
        _deploy(build, "longrag-down", "/down", index_cls=FakeShardsIndex.with_dead((1, 0), (1, 1)),
                overrides=("llm.num_cpus=0.1",))
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60, headers=AUTH) as c:
            serve_status_wait(["longrag", "longrag-local", "longrag-down"])
            yield c
    finally:
        serve.shutdown()
        ray.shutdown()


def serve_status_wait(apps: list[str], timeout_s: float = 120) -> None:
    import time

    deadline = time.time() + timeout_s
    while True:
        status = serve.status().applications
        states = {a: str(getattr(status[a].status, "value", status[a].status)) if a in status else "MISSING" for a in apps}
        if all(s == "RUNNING" for s in states.values()):
            return
        assert time.time() < deadline and "DEPLOY_FAILED" not in states.values(), states
        time.sleep(0.2)


def _error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}, body
    assert body["error"]["code"] == code and body["error"]["message"], body
    return body["error"]


def test_retrieve_returns_the_core_records(client):
    r = client.post("/v1/retrieve", json={"question": "Who wrote the novel Animal Farm?", "k": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [u["titles"] for u in body["units"]][0] == ["Animal Farm"]
    top = body["units"][0]
    assert set(top) == {"unit_id", "titles", "doc_ids", "score", "shard", "best_chunk_id", "best_chunk", "n_tokens",
                        "doc_scores", "found_by"}
    assert top["doc_scores"] is None and top["found_by"] is None  # retrieval.document_order=stored
    assert top["best_chunk"] == "Animal Farm is a novel by George Orwell." and top["doc_ids"] == ["0"]
    cov = body["coverage"]
    assert cov == {"shards": 2, "answered": 2, "errors": {}, "failovers": cov["failovers"], "degraded": False,
                   "failed_shards": [], "replicas": cov["replicas"], "redundancy": cov["redundancy"],
                   "redundancy_degraded": cov["redundancy_degraded"], "fetch_errors": {}, "unfetched": []}


def test_iterative_retrieval_asks_the_llm_for_a_bridge(client):
    """mode=iterative reaches the hop loop: the LLMServer is asked for a bridge (the fake reader finds no
    "Title:" line in the evidence and answers "unknown", so the loop stops after the first search; the
    second search itself is tested in tests/longrag/test_hops.py) and the trace and units say so."""
    q = "Who wrote the novel Animal Farm?"
    dense = client.post("/v1/retrieve", json={"question": q, "k": 3}).json()
    body = client.post("/v1/retrieve", json={"question": q, "k": 3, "mode": "iterative"}).json()
    hops = body["trace"]["hops"]
    assert len(hops) == 1 and hops[0]["query"] == q and hops[0]["stopped"] == "no bridge"
    assert hops[0]["llm_ms"] > 0 and body["trace"]["bridge_ms"] > 0
    assert [u["unit_id"] for u in body["units"]] == [u["unit_id"] for u in dense["units"]]
    assert {u["found_by"] for u in body["units"]} == {"hop 1"} and "hops" not in dense["trace"]
    _error(client.post("/v1/retrieve", json={"question": q, "mode": "pagerank"}), 422, "invalid_request")
    answer = client.post("/v1/answer", json={"question": q, "k": 2, "mode": "iterative"})
    assert answer.status_code == 200 and len(answer.json()["trace"]["hops"]) == 1
    chat = client.post("/v1/chat/completions", json={"model": "longrag", "k": 2, "mode": "iterative",
                                                     "messages": [{"role": "user", "content": q}]})
    assert chat.status_code == 200 and len(chat.json()["longrag"]["trace"]["hops"]) == 1


def test_hybrid_retrieval_fuses_bm25_on_both_index_backends(client):
    """mode=hybrid reaches the shards (actors with a dead replica, and in process) with the question's
    text: BM25 finds the unit whose words the question shares, each unit says which signal found it,
    and both backends fuse to the same list."""
    q = "Which country lies within the Kingdom of the Netherlands?"
    body = client.post("/v1/retrieve", json={"question": q, "k": 3, "mode": "hybrid"}).json()
    units = body["units"]
    assert units[0]["titles"] == ["Aruba"] and "bm25" in units[0]["found_by"], units
    assert all(u["found_by"] in ("dense", "bm25", "dense+bm25") for u in units)
    assert not body["coverage"]["degraded"]
    local = client.post("/local/v1/retrieve", json={"question": q, "k": 3, "mode": "hybrid"}).json()
    assert [(u["unit_id"], u["found_by"]) for u in local["units"]] == [(u["unit_id"], u["found_by"]) for u in units]
    chat = client.post("/v1/chat/completions", json={"model": "longrag", "k": 2, "mode": "hybrid",
                                                     "messages": [{"role": "user", "content": q}]})
    assert chat.status_code == 200, chat.text


def test_graph_retrieval_brings_linked_units_on_both_index_backends(client):
    """mode=graph (the apps walk from the dense top 1 of 2 candidates, retrieval.graph_*): the unit
    linked to the best one comes in though the dense search left it out, marked found_by "graph",
    with the best chunk its shard picked for the question; both backends agree; hybrid+graph too."""
    q = "What is the capital of Angola?"
    dense = client.post("/v1/retrieve", json={"question": q, "k": 3}).json()["units"]
    assert dense[0]["titles"] == ["Luanda"]
    body = client.post("/v1/retrieve", json={"question": q, "k": 3, "mode": "graph"}).json()
    units = body["units"]
    assert [u["titles"][0] for u in units[:1]] == ["Luanda"] and units[0]["found_by"] == "dense"
    assert "George Gershwin" not in [u["titles"][0] for u in dense[:2]]  # the dense candidates (graph_depth 2)
    linked = next(u for u in units if u["titles"] == ["George Gershwin"])
    assert linked["found_by"] == "graph" and linked["best_chunk"] == DOCS[4][1], units
    assert body["trace"]["retrieve.graph_ms"] >= 0 and not body["coverage"]["degraded"]
    local = client.post("/local/v1/retrieve", json={"question": q, "k": 3, "mode": "graph"}).json()
    assert [(u["unit_id"], u["found_by"], u["best_chunk"]) for u in local["units"]] == \
        [(u["unit_id"], u["found_by"], u["best_chunk"]) for u in units]
    both = client.post("/v1/retrieve", json={"question": q, "k": 3, "mode": "hybrid+graph"}).json()["units"]
    assert "graph" in {u["found_by"] for u in both}
    answer = client.post("/v1/answer", json={"question": q, "k": 2, "mode": "graph"})
    assert answer.status_code == 200, answer.text


def test_a_dead_replica_fails_over_and_shows_in_healthz(client):
    """Replica 0 of shard 1 is dead: a call that meets it is tried again (counted) and the router
    leaves it out from then on; the results stay complete, and /readyz and every response's coverage
    name the lost redundancy ("1 of 2 replicas", the deployment's running count)."""
    failovers = []
    client.get("/readyz")  # the health check's pings find the dead replica (as Serve's health checks do)
    for _ in range(4):
        r = client.post("/v1/retrieve", json={"question": "Who composed An American in Paris?", "k": 5})
        assert r.status_code == 200, r.text
        cov = r.json()["coverage"]
        assert cov["answered"] == 2 and cov["degraded"] is False
        assert cov["redundancy_degraded"] is True and cov["redundancy"] == \
            "shard 0: 2 of 2 replicas; shard 1: 1 of 2 replicas", cov
        assert cov["replicas"][1] == {"shard": 1, "live": 1, "replicas": 2}
        failovers.append(cov["failovers"])
    assert set(failovers) <= {0, 1} and sum(failovers) <= 1, failovers  # the dead one is left out
    body = client.get("/readyz").json()
    assert body["status"] == "degraded" and body["llm"] == "title-reader" and body["shards"] == 2
    assert body["redundancy"] == "shard 0: 2 of 2 replicas; shard 1: 1 of 2 replicas"
    assert "shard 1: 1 of 2 replicas live" in body["problems"]


def test_a_shard_with_no_live_replica_keeps_the_pod_ready_and_the_answers_degraded(client):
    """Issue 40, item 3: every replica of shard 1 is gone. /readyz is every KubeRay worker group's
    readinessProbe, so it stays 200 (the pod can answer) and names the shard in its report;
    /v1/answer answers from shard 0 with ``degraded`` set and shard 1 named."""
    ready = client.get("/down/readyz")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["status"] == "degraded" and "shard 1: no live replica" in body["problems"], body
    assert body["redundancy"] == "shard 0: 2 of 2 replicas; shard 1: 0 of 2 replicas", body
    for _ in range(2):  # the first meets the dead replicas, the next finds none running
        r = client.post("/down/v1/answer", json={"question": "What is the capital of Angola?", "k": 2})
        assert r.status_code == 200, r.text
        cov = r.json()["coverage"]
        assert cov["degraded"] is True and cov["failed_shards"] == [1] and cov["answered"] == 1, cov
    assert httpx.get(f"http://127.0.0.1:{PORT}/down/readyz", timeout=30).status_code == 200  # no key: the same


def test_answer_goes_through_the_reader_and_the_llm(client):
    r = client.post("/v1/answer", json={"question": "What is the capital of Angola?", "k": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "Luanda" and body["long_answer"] == "The documents say: Luanda."
    assert body["evidence"][0] == {**body["evidence"][0], "titles": ["Luanda"], "used": True}
    assert body["trace"]["prompt_tokens"] > 0 and body["trace"]["read_ms"] > 0
    # this app reads its units whole (retrieval.document_order=stored): no paragraphs packed
    assert body["trace"]["context_packed"] is False and body["trace"]["paragraphs_read"] == []


def test_bad_requests_get_the_one_error_shape(client):
    _error(client.post("/v1/retrieve", json={"question": " ", "k": 2}), 422, "invalid_request")
    _error(client.post("/v1/retrieve", json={"question": "x", "k": 101}), 422, "invalid_request")
    _error(client.post("/v1/retrieve", content=b'{"question": "\\ud800"}',
                       headers={"content-type": "application/json"}), 422, "invalid_request")


# ---------------------------------------------------------------------------- OpenAI-compatible API


def _openai(**kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key=KEY, max_retries=0, **kw)


def test_models_lists_longrag_and_longrag_dual(client):
    models = {m.id: m for m in _openai().models.list()}
    assert set(models) == {"longrag", "longrag-dual"}
    assert models["longrag"].model_extra["available"] is True
    assert models["longrag-dual"].model_extra["available"] is True  # the app has the dual deployments


def test_openapi_states_the_chat_limits(client):
    schema = client.get("/openapi.json").json()
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["additionalProperties"] is False and chat["required"] == ["model", "messages"]
    (k_int,) = [o for o in chat["properties"]["k"]["anyOf"] if o.get("type") == "integer"]
    assert (k_int["minimum"], k_int["maximum"]) == (1, 100)
    responses = schema["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"401", "404", "413", "422", "429", "503"} <= set(responses)
    assert "text/event-stream" in responses["200"]["content"]


def test_chat_completion_with_the_openai_client(client):
    reply = _openai().chat.completions.create(
        model="longrag", extra_body={"k": 2},
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about Aruba."},
                  {"role": "assistant", "content": "Aruba is an island."},
                  {"role": "user", "content": "What is the capital of Angola?"}],
    )
    assert reply.object == "chat.completion" and reply.model == "longrag"
    assert reply.choices[0].message.content == "Luanda" and reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens > 0 and reply.usage.total_tokens > reply.usage.prompt_tokens
    extra = reply.model_extra["longrag"]
    assert extra["long_answer"] == "The documents say: Luanda."
    assert extra["evidence"][0]["titles"] == ["Luanda"] and len(extra["evidence"]) == 2
    assert extra["coverage"]["answered"] == 2 and extra["trace"]["read_ms"] > 0


def test_chat_completion_streams_with_the_openai_client(client):
    stream = _openai().chat.completions.create(
        model="longrag", stream=True, messages=[{"role": "user", "content": "What is the capital of Angola?"}])
    chunks = list(stream)  # the client stops at data: [DONE]
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert reasoning == "The documents say: Luanda." and content == "Luanda"
    # issue 39: the short answer (content) comes before the long answer's first delta
    first_content = next(i for i, c in enumerate(chunks) if c.choices[0].delta.content)
    first_reasoning = next(i for i, c in enumerate(chunks) if c.choices[0].delta.model_extra.get("reasoning_content"))
    assert first_content < first_reasoning
    assert sum(1 for c in chunks if c.choices[0].delta.model_extra.get("reasoning_content")) == 4  # word by word
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop" and last.usage.completion_tokens > 0
    assert last.model_extra["longrag"]["evidence"][0]["titles"] == ["Luanda"]


def test_chat_stream_ends_with_done_on_the_wire(client):
    with client.stream("POST", "/v1/chat/completions", json={
            "model": "longrag", "stream": True, "messages": [{"role": "user", "content": "Who wrote Animal Farm?"}]}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)


def test_longrag_dual_model_runs_the_dual_deployments(client):
    reply = _openai().chat.completions.create(
        model="longrag-dual", extra_body={"k": 2, "strategy": "Fil"},
        messages=[{"role": "user", "content": "What is the capital of Angola?"}])
    # the fake reader names a title it finds in the prompt; the generator's chunks carry none
    assert reply.model == "longrag-dual" and reply.choices[0].message.content.startswith("The documents say")
    dual = reply.model_extra["longrag"]["trace"]["dual"]
    assert [s["stage"] for s in dual["stages"]] == ["filter", "generator"]
    assert reply.usage.prompt_tokens == sum(s["prompt_tokens"] for s in dual["stages"]) > 0
    r = client.post("/v1/longcontext", json={"document": DOCS[1][1] + "\n\n" + DOCS[0][1],
                                             "question": "What is the capital of Angola?", "strategy": "R&B"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["strategy"] == "R&B" and body["route"] is None and body["trace"]["generator_input_tokens"] > 0
    assert [s["stage"] for s in body["trace"]["stages"]] == ["generator"]


def test_chat_errors_keep_the_error_shape(client):
    err = _error(client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": [
        {"role": "user", "content": "x"}]}), 404, "model_not_found")
    assert "longrag" in err["message"]
    _error(client.post("/v1/chat/completions", json={"model": "longrag", "messages": [
        {"role": "assistant", "content": "x"}]}), 422, "invalid_request")
    _error(client.post("/v1/chat/completions", json={"model": "longrag", "messages": [
        {"role": "user", "content": "x"}], "strategy": "E&F"}), 422, "invalid_request")


def _events(r: httpx.Response) -> list[tuple[str, Any]]:
    import json

    out, name = [], None
    for line in r.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
    return out


def test_answer_streams_retrieval_the_short_answer_tokens_then_the_trace(client):
    with client.stream("POST", "/v1/answer", json={"question": "What is the capital of Angola?", "k": 2,
                                                   "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
    names = [n for n, _ in events]
    # issue 39: the short answer as soon as it is ready, then the long answer's tokens
    assert names[:2] == ["retrieval", "answer"] and names[-1] == "trace" and set(names[2:-1]) == {"token"}
    assert events[1][1]["answer"] == "Luanda" and events[1][1]["time_to_answer_ms"] > 0
    retrieval = events[0][1]
    assert retrieval["units"][0]["titles"] == ["Luanda"] and retrieval["coverage"]["answered"] == 2
    assert "".join(d["text"] for n, d in events if n == "token") == "The documents say: Luanda."
    final = events[-1][1]
    assert final["answer"] == "Luanda" and final["evidence"][0]["used"] is True and final["trace"]["total_ms"] > 0
    assert 0 < final["trace"]["time_to_answer_ms"] <= final["trace"]["read_ms"]


def test_answer_without_the_long_answer_is_one_llm_call(client):
    """A request's long_answer=false: the response comes when the short answer is ready."""
    r = client.post("/v1/answer", json={"question": "What is the capital of Angola?", "k": 2, "long_answer": False})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "Luanda" and body["long_answer"] == ""
    assert body["trace"]["completion_tokens"] == 1  # the short answer's one word, no long answer
    with client.stream("POST", "/v1/answer", json={"question": "What is the capital of Angola?", "k": 2,
                                                   "stream": True, "long_answer": False}) as r:
        names = [n for n, _ in _events(r)]
    assert names == ["retrieval", "answer", "trace"]


# ---------------------------------------------------------------------------- keys, limits, CORS, metrics


def test_api_keys_are_required_when_configured(client):
    question = {"question": "Who wrote Animal Farm?", "k": 1}
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as bare:
        err = _error(bare.post("/v1/retrieve", json=question), 401, "unauthorized")
        assert "API key is required" in err["message"]
        r = bare.post("/v1/retrieve", json=question, headers={"Authorization": "Bearer wrong-key"})
        err = _error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer" and "wrong-key" not in r.text
        assert bare.post("/v1/retrieve", json=question, headers={"X-API-Key": OTHER_KEY}).status_code == 200
        assert bare.get("/readyz").status_code == 200  # health stays open to load balancers
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="wrong", max_retries=0).models.list()


def test_rate_limit_answers_429_with_retry_after(client):
    """The bucket holds 30 (one used by the test before), refilled at 2/s: of 40 requests at once,
    the ones past it get 429."""
    import asyncio

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT}", timeout=60,
                                     headers={"Authorization": f"Bearer {OTHER_KEY}"}) as ac:
            return await asyncio.gather(*(ac.get("/v1/models") for _ in range(40)))

    responses = asyncio.run(burst())
    limited = [r for r in responses if r.status_code == 429]
    assert 1 <= len(limited) <= 11, [r.status_code for r in responses]  # fewer: refilled while served
    assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
    _error(limited[0], 429, "too_many_requests")
    assert client.get("/v1/models").status_code == 200  # the other key has its own bucket


def test_body_size_limit_gives_413(client):
    big = {"question": "x" * 70_000}
    err = _error(client.post("/v1/retrieve", json=big), 413, "payload_too_large")
    assert "serve.max_body_bytes" in err["message"]


def _ingress_rss() -> int:
    """RSS of the app's Ingress replica process (Ray titles it ``ray::ServeReplica:<app>:<deployment>``)."""
    import psutil

    procs = [p for p in psutil.process_iter(["cmdline"]) if "ServeReplica:longrag:Ingress" in " ".join(p.info["cmdline"] or [])]
    assert procs, "no Ingress replica process"
    return sum(p.memory_info().rss for p in procs)


def _send_unfinished_chunked(path: str, total: int, chunk: int = 64 * 1024) -> tuple[str, int]:
    """POST ``total`` bytes as a chunked body (no Content-Length) on a raw socket and never send the
    last chunk: a server that reads the whole body before its size check never answers (the socket
    times out, status ""); one that counts bytes as they arrive answers while the body is unfinished.
    Returns the status line and the bytes sent before the server answered (or stopped taking them)."""
    import select
    import socket

    sock = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    sock.sendall((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
                  "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
    piece = f"{chunk:x}\r\n".encode() + b"x" * chunk + b"\r\n"
    sent, reply = 0, b""
    try:
        while sent < total:
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered before the body was sent
            sock.sendall(piece)
            sent += chunk
    except OSError:
        pass  # the server closed the connection: it stopped reading
    try:
        while b"\r\n" not in reply:
            data = sock.recv(65536)
            if not data:
                break
            reply += data
    except TimeoutError:
        pass  # no answer: the server is still waiting for the rest of the body
    finally:
        sock.close()
    return reply.split(b"\r\n", 1)[0].decode(), sent


def test_a_chunked_body_over_the_limit_is_refused_as_it_streams(client):
    """No Content-Length: the body is counted as it arrives and refused past the limit (64 KiB), not
    read whole first (the body never ends, so only a refusal while it streams answers); the Ingress'
    memory does not grow by what was sent (up to 64 MiB, 1,000x the limit)."""
    before = _ingress_rss()
    total = 1024 * 64 * 1024
    status, sent = _send_unfinished_chunked("/v1/retrieve", total)
    assert status.split()[1:2] == ["413"], f"{status!r} after {sent} bytes of an unfinished body"
    assert _ingress_rss() - before < total // 2  # not the body (other requests' noise: ~20 MB under load)
    # the app is still there and serving (200; "degraded" only by the replica an earlier test
    # killed): the refused body cost it nothing. A replica still busy with the flood may answer its
    # health check late, so a few seconds are allowed.
    deadline = time.time() + 30
    while (health := client.get("/readyz")).status_code != 200 and time.time() < deadline:
        time.sleep(0.5)
    assert health.status_code == 200, health.text


def test_cors_allows_only_the_configured_origin(client):
    pre = client.options("/v1/answer", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN
    other = client.get("/v1/models", headers={"Origin": "http://elsewhere.example"})
    assert "access-control-allow-origin" not in other.headers


def test_metrics_are_exported_for_prometheus(client):
    """Ray's metrics port serves the app's counters and histograms (exported every second here)."""
    import time

    client.post("/v1/answer", json={"question": "Who wrote the novel Animal Farm?", "k": 2})
    client.post("/v1/retrieve", json={"question": " ", "k": 2})  # a 422
    # (shard failovers: tests/serve/test_faults.py, where a replica that answers pings fails a search;
    # the dead replica here is known dead from the health check's pings and is tried last)
    wanted = ["ray_longrag_requests_total", "ray_longrag_errors_total", "ray_longrag_stage_latency_ms_bucket",
              "ray_longrag_llm_tokens_total"]
    deadline, text = time.time() + 60, ""
    while time.time() < deadline:
        text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
        if all(name in text for name in wanted) and 'status="422"' in text:
            break
        time.sleep(1)
    missing = [name for name in wanted if name not in text]
    assert not missing, missing
    assert 'route="/v1/answer"' in text and 'stage="read"' in text and 'kind="completion"' in text


# ----------------------------------------------------------------- the single-machine profile


def test_colocated_app_answers_as_the_split_app_does_with_two_deployments(client):
    """``serve.colocate``: the same units, scores and answers as the app with separate deployments
    over shard replicas, from an app of two deployments (the Ingress holds every other stage)."""
    assert set(serve.status().applications["longrag-local"].deployments) == {"Ingress", "LLMServer"}
    for question in ("Who wrote the novel Animal Farm?", "What is the capital of Angola?"):
        split = client.post("/v1/retrieve", json={"question": question, "k": 3}).json()
        local = client.post("/local/v1/retrieve", json={"question": question, "k": 3})
        assert local.status_code == 200, local.text
        local = local.json()
        assert [(u["unit_id"], round(u["score"], 5)) for u in local["units"]] == \
            [(u["unit_id"], round(u["score"], 5)) for u in split["units"]]
        assert local["coverage"]["answered"] == local["coverage"]["shards"] == 2 and not local["coverage"]["degraded"]
        assert local["trace"]["encode_ms"] >= 0 and "retrieve.search_ms" in local["trace"]
    answer = client.post("/local/v1/answer", json={"question": "Who wrote the novel Animal Farm?", "k": 2})
    assert answer.status_code == 200 and answer.json()["answer"] == "Animal Farm", answer.text
    # this app packs the reader's context (retrieval.document_order=packed, the default): the trace names them
    trace = answer.json()["trace"]
    assert trace["context_packed"] is True and trace["paragraphs_read"], trace
    assert {p["unit_id"] for p in trace["paragraphs_read"]} <= {e["unit_id"] for e in answer.json()["evidence"]}
    with client.stream("POST", "/local/v1/answer", json={"question": "Who wrote the novel Animal Farm?",
                                                          "k": 2, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line.startswith("event: ")]
    assert r.status_code == 200 and events[0] == "event: retrieval" and events[-1] == "event: trace", events
    assert "event: token" in events
    dual = client.post("/local/v1/answer", json={"question": "What is the capital of Angola?", "k": 2,
                                                 "strategy": "Fil"})
    assert dual.status_code == 200, dual.text
    assert [s["stage"] for s in dual.json()["trace"]["dual"]["stages"]] == ["filter", "generator"]
    lc = client.post("/local/v1/longcontext", json={"document": DOCS[1][1] + "\n\n" + DOCS[0][1],
                                                    "question": "What is the capital of Angola?", "k": 1})
    assert lc.status_code == 200 and lc.json()["answer"], lc.text


def test_colocated_app_keeps_health_guard_and_errors_under_its_prefix(client):
    health = httpx.get(f"http://127.0.0.1:{PORT}/local/readyz", timeout=30)  # open: no key
    assert health.status_code == 200, health.text
    body = health.json()
    assert body["status"] == "ok" and [row["live"] for row in body["index"]] == [1, 1]
    assert httpx.post(f"http://127.0.0.1:{PORT}/local/v1/retrieve", json={"question": "x"}).status_code == 401
    bad = client.post("/local/v1/retrieve", json={"question": "Who?", "k": 0})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
    big = client.post("/local/v1/retrieve", content=b"x" * (65 * 1024), headers={"content-type": "application/json"})
    assert big.status_code == 413


# ---------------------------------------------------------------- the LLMServer's router (serve.routing)


def test_reader_calls_with_one_top_unit_go_to_one_llm_replica(client):
    """serve.llm_routing=unit_affinity (the default) over 2 LLMServer replicas: every call with the same
    cached prefix (the reader's top unit) reaches the same replica, different prefixes reach both, and
    calls without a prefix are spread by power of two choices."""
    cfg = LongRAGConfig()
    app = LLMServer.options(num_replicas=2, ray_actor_options={"num_cpus": 0.1},
                            **llm_router_options(cfg)).bind(cfg.llm, ReplicaNamer)
    handle = serve.run(app, name="routing", route_prefix=None)
    try:
        msgs = [{"role": "user", "content": "q?"}]

        def where(prefix):
            return handle.chat.remote(msgs, 4, None, None, cache_prefix=prefix).result(timeout_s=30).text

        homes = {}
        for i in range(12):
            prefix = f"Documents:\n\nTitle: unit {i}\n..."
            seen = {where(prefix) for _ in range(3)}
            assert len(seen) == 1, (i, seen)
            homes[i] = seen.pop()
        assert len(set(homes.values())) == 2, homes
        assert len({where(None) for _ in range(20)}) == 2
    finally:
        serve.delete("routing")


# ---------------------------------------------------------------- the query encoder's dimension against the build
# Plain unit tests of the deployments' classes (``func_or_class``), no Ray: the check runs where a replica starts.


class NarrowEncoder(HashEncoder):
    """Like HashEncoder, but 32-dimensional: an encoder the tiny builds (64) were not embedded with."""

    dim = 32


class DimlessEncoder:
    """An encoder without a ``dim``: the replica encodes a probe question to learn it (32)."""

    def __init__(self, embedding=None) -> None:
        self.encoder = NarrowEncoder(embedding)

    def encode_queries(self, texts):
        return self.encoder.encode_queries(texts)


def test_query_encoder_refuses_a_build_of_another_dimension(build):
    from longrag.config import EmbeddingConfig
    from longrag.index.manifest import DimensionMismatch
    from serve.deployments import QueryEncoder

    QueryEncoder.func_or_class(EmbeddingConfig(), HashEncoder, index=build)  # 64 = 64: starts
    with pytest.raises(DimensionMismatch, match=r"makes 32-dimensional vectors, but build \S+ holds 64-dimensional"):
        QueryEncoder.func_or_class(EmbeddingConfig(dim=32), NarrowEncoder, index=build)
    with pytest.raises(DimensionMismatch, match="embedding.dim=32"):
        QueryEncoder.func_or_class(EmbeddingConfig(dim=32), DimlessEncoder, index=build)
    QueryEncoder.func_or_class(EmbeddingConfig(), NarrowEncoder)  # no build given: nothing to check


def test_the_app_gives_the_query_encoder_its_build():
    app = build_app(LongRAGConfig(), "artifacts/some-build", encoder_cls=NarrowEncoder)
    encoder = app._bound_deployment.init_args[2]["encoder"]._bound_deployment
    assert encoder.init_kwargs == {"index": "artifacts/some-build"}


def test_retriever_does_not_follow_an_alias_to_a_build_of_another_dimension(tmp_path, monkeypatch):
    import asyncio
    from types import SimpleNamespace

    from longrag.config import IndexConfig
    from longrag.index.alias import publish
    from longrag.index.manifest import DimensionMismatch
    from serve import deployments

    wide = write_tiny_build(tmp_path / "alias" / "b64", DOCS, shards=2)
    monkeypatch.setattr(HashEncoder, "dim", 32)
    narrow = write_tiny_build(tmp_path / "alias" / "b32", DOCS, shards=2)
    monkeypatch.undo()
    alias = str(tmp_path / "alias")
    publish(alias, wide)
    monkeypatch.setattr(deployments.serve, "get_replica_context",
                        lambda: SimpleNamespace(app_name="test", replica_id="r1"))
    retriever = deployments.Retriever.func_or_class(alias, IndexConfig(refresh_s=0), FakeShardsIndex)
    served = retriever.manifest.build_id
    publish(alias, narrow)
    with pytest.raises(DimensionMismatch, match="holds 32-dimensional vectors, the query encoder makes 64"):
        asyncio.run(retriever.refresh())
    assert retriever.manifest.build_id == served and retriever.manifest.embedding.dim == 64
