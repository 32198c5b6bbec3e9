"""Faults of the Serve app over fakes, fast: stage deadlines (504 naming the stage), an LLM that
raises or whose replica process dies while an answer is in flight (one retry, then a JSON 503; a
stream that already started ends with an error event), a client that goes away (its LLM call
cancelled three hops down), the request's own deadline (``X-Request-Timeout``) and the reader's
admission (503 with ``Retry-After`` at once, /v1/retrieve still served). The backends misbehave on markers in the
question (``tests/fakes.py``:
``SleepyEncoder``, ``SleepyIndex``, ``FaultyReader``); the deployments, ingress, ``ShardedIndex``
and Serve itself are the real ones. Killing real replicas of the real app: ``tests/serve/test_app.py``
and ``python -m jobs.chaos``. The OpenAPI schema is fuzzed in ``tests/serve/test_fuzz.py``, over
the production deadlines: this app's are seconds, so that its slow fakes trip them quickly."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from ray import serve

from cluster.local import WORKER_ENV
from serve.run import deploy, wait_running
from tests.fakes import FLAKY_K, SLEEP_S, SLOW_K, write_tiny_build

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
PORT = 8400
METRICS_PORT = 8402
APP = "faults"
DOCS = [
    ("Animal Farm", "Animal Farm is a novel by George Orwell. It was published in 1945."),
    ("Luanda", "Luanda is the capital of Angola. It lies on the Atlantic coast."),
    ("Apollo 11", "Apollo 11 was the first spaceflight to land humans on the Moon in 1969."),
    ("Aruba", "Aruba is a country within the Kingdom of the Netherlands."),
]
TIMEOUTS = {"encode_s": 2, "retrieve_s": 2, "read_s": 10, "dual_s": 4, "longcontext_s": 4}
QUESTION = "What is the capital of Angola?"
READER_LIMIT = 2  # serve.max_reader_requests of this app


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    build = write_tiny_build(tmp_path_factory.mktemp("tiny") / "build", DOCS, shards=2)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=4, include_dashboard=False, namespace="longrag",
             runtime_env={"env_vars": {**WORKER_ENV, "PYTHONPATH": path}},
             _metrics_export_port=METRICS_PORT, _system_config={"metrics_report_interval_ms": 1000})
    try:
        overrides = ["index.replicas=2", "serve.readyz_cache_s=0", f"serve.max_reader_requests={READER_LIMIT}",
                     *(f"serve.timeouts.{k}={v}" for k, v in TIMEOUTS.items())]
        # the LLMServer's health checked every second: Serve notices a dead replica at once
        deploy({"http_options": {"host": "127.0.0.1", "port": PORT}, "applications": [{
            "name": APP, "route_prefix": "/", "import_path": "tests.fakes:faults_app",
            "args": {"index": build, "overrides": overrides},
            "deployments": [{"name": "LLMServer", "health_check_period_s": 1, "health_check_timeout_s": 5}],
        }]})
        assert wait_running([APP], ready_timeout_s=180) is None
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as c:
            yield c
    finally:
        serve.shutdown()
        ray.shutdown()


def _error(r: httpx.Response, status: int, code: str, stage: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}, body
    err = body["error"]
    assert err["code"] == code and err["detail"]["stage"] == stage and stage in err["message"], err
    return err


def _timed(fn, *args, **kw) -> tuple[httpx.Response, float]:
    t0 = time.perf_counter()
    r = fn(*args, **kw)
    return r, time.perf_counter() - t0


# ---------------------------------------------------------------------------- stage deadlines: 504


def test_a_slow_encoder_gets_504_naming_encode(client):
    r, took = _timed(client.post, "/v1/retrieve", json={"question": f"[slow-encode] {QUESTION}", "k": 2})
    err = _error(r, 504, "timeout", "encode")
    assert err["detail"]["timeout_s"] == TIMEOUTS["encode_s"] and "serve.timeouts.encode_s" in err["message"]
    assert took < TIMEOUTS["encode_s"] + 2, took
    deadline = time.time() + 30  # the encoder's batch loop finishes the sleeping batch, then answers again
    while (r := client.post("/v1/retrieve", json={"question": QUESTION, "k": 2})).status_code != 200:
        _error(r, 504, "timeout", "encode")  # only the same deadline while the slow batch runs
        assert time.time() < deadline, r.text


def test_a_slow_retriever_gets_504_naming_retrieve(client):
    r, took = _timed(client.post, "/v1/retrieve", json={"question": QUESTION, "k": SLOW_K})
    _error(r, 504, "timeout", "retrieve")
    assert took < TIMEOUTS["retrieve_s"] + 2, took
    assert client.post("/v1/retrieve", json={"question": QUESTION, "k": 2}).status_code == 200


def test_a_slow_reader_gets_504_naming_read(client):
    r, took = _timed(client.post, "/v1/answer", json={"question": f"[slow-read] {QUESTION}", "k": 2})
    _error(r, 504, "timeout", "read")
    assert took < TIMEOUTS["read_s"] + 3, took
    r = client.post("/v1/chat/completions", json={"model": "longrag", "messages": [
        {"role": "user", "content": f"[slow-read] {QUESTION}"}]})
    _error(r, 504, "timeout", "read")


def test_a_slow_dual_strategy_gets_504_naming_dual(client):
    r, took = _timed(client.post, "/v1/answer", json={"question": f"[slow-dual] {QUESTION}", "k": 2,
                                                       "strategy": "R&B"})
    _error(r, 504, "timeout", "dual")
    assert took < TIMEOUTS["dual_s"] + 3, took


def test_a_stream_past_its_deadline_ends_with_a_timeout_event(client):
    events = _stream(client, f"[slow-read] {QUESTION}")
    assert [n for n, _ in events] == ["retrieval", "error"], events
    err = events[-1][1]["error"]
    assert err["code"] == "timeout" and err["detail"]["stage"] == "read", err


# ---------------------------------------------------------------------------- the LLM fails mid-answer


def test_an_llm_that_fails_once_is_retried_and_answers(client):
    r = client.post("/v1/answer", json={"question": f"[fail-once:a1] {QUESTION}", "k": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "Luanda" and body["trace"]["read_retries"] == 1
    r = client.post("/v1/chat/completions", json={"model": "longrag", "messages": [
        {"role": "user", "content": f"[fail-once:c1] {QUESTION}"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Luanda", r.text


def test_an_llm_that_keeps_failing_gets_a_json_503_naming_read(client):
    r, took = _timed(client.post, "/v1/answer", json={"question": f"[fail-always] {QUESTION}", "k": 2})
    err = _error(r, 503, "unavailable", "read")
    assert err["detail"]["attempts"] == 2 and "LLMError" in err["detail"]["errors"][-1], err
    assert took < 5, took
    assert client.post("/v1/answer", json={"question": QUESTION, "k": 2}).status_code == 200


def test_a_dead_llm_replica_gets_a_json_503_and_the_next_request_succeeds(client):
    """``[die]``: the LLMServer replica's process exits while the answer is in flight. The ingress
    retries once (the retry reaches the dead or the restarted replica, which dies again) and
    answers a JSON 503 within the read deadline; the next requests reach the restarted replica. Until
    Serve has started it (seconds here; longer on a loaded machine, as beside the other xdist worker's
    Ray) a request may get the read stage's JSON 503 or 504, never anything else."""
    r, took = _timed(client.post, "/v1/answer", json={"question": f"[die] {QUESTION}", "k": 2})
    err = _error(r, 503, "unavailable", "read")
    assert any("Died" in e or "Unavailable" in e or "died" in e for e in err["detail"]["errors"]), err
    assert took < TIMEOUTS["read_s"] + 3, took
    deadline = time.monotonic() + 120
    while (r := client.post("/v1/answer", json={"question": QUESTION, "k": 2})).status_code != 200:
        _error(r, r.status_code, "unavailable" if r.status_code == 503 else "timeout", "read")
        assert r.status_code in (503, 504) and time.monotonic() < deadline, r.text
    assert r.json()["answer"] == "Luanda", r.text


def _stream(client: httpx.Client, question: str) -> list[tuple[str, Any]]:
    out, name = [], None
    with client.stream("POST", "/v1/answer", json={"question": question, "k": 2, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
    return out


def test_a_stream_that_fails_before_its_first_token_is_retried(client):
    events = _stream(client, f"[fail-once:s1] {QUESTION}")
    names = [n for n, _ in events]
    # the short answer's call failed first: retried, then the answer, the long answer's tokens, the trace
    assert names[:2] == ["retrieval", "answer"] and names[-1] == "trace" and set(names[2:-1]) == {"token"}, names
    assert events[1][1]["answer"] == events[-1][1]["answer"] == "Luanda"


def test_a_stream_that_fails_mid_answer_ends_with_an_error_event(client):
    events = _stream(client, f"[fail-mid-stream] {QUESTION}")
    names = [n for n, _ in events]
    assert names == ["retrieval", "answer", "token", "token", "error"], names  # the short answer was sent first
    err = events[-1][1]["error"]
    assert err["code"] == "unavailable" and err["detail"]["stage"] == "read", err
    assert "after the answer had started streaming" in err["message"] and "LLMError" in err["message"], err


def test_a_chat_stream_that_fails_mid_answer_ends_with_an_error_then_done(client):
    with client.stream("POST", "/v1/chat/completions", json={"model": "longrag", "stream": True, "messages": [
            {"role": "user", "content": f"[fail-mid-stream] {QUESTION}"}]}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]", lines
    err = json.loads(lines[-2][6:])["error"]
    assert err["code"] == "unavailable" and err["detail"]["stage"] == "read", err


# ---------------------------------------------------------------------------- shard replicas


def test_a_replica_that_fails_a_search_fails_over_and_is_counted(client):
    """Replica 0 of shard 0 passes its health checks but fails searches with k=FLAKY_K: a search that
    meets it (round robin: one of two) is tried again (a 200 with full results); the replica still
    counts as running (as Serve counts it), and the failover reaches the metrics."""
    covs = []
    for _ in range(4):
        r = client.post("/v1/retrieve", json={"question": QUESTION, "k": FLAKY_K})
        assert r.status_code == 200, r.text
        covs.append(r.json()["coverage"])
    assert all(c["answered"] == 2 and c["failovers"] <= 1 for c in covs) and sum(c["failovers"] for c in covs) >= 1
    assert covs[-1]["redundancy"] == "shard 0: 2 of 2 replicas; shard 1: 2 of 2 replicas", covs
    body = client.get("/readyz").json()
    assert body["redundancy"] == "shard 0: 2 of 2 replicas; shard 1: 2 of 2 replicas", body
    deadline, text = time.time() + 60, ""
    while time.time() < deadline:
        text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
        if "ray_longrag_shard_failovers_total" in text and 'status="504"' in text and 'status="503"' in text:
            break
        time.sleep(1)
    assert "ray_longrag_shard_failovers_total" in text
    assert 'status="504"' in text and 'status="503"' in text  # the stage errors above, counted by status


# ---------------------------------------------------------------------------- traffic: cancellation, deadlines, admission (issue 44)


def _llm_description():
    return serve.get_deployment_handle("LLMServer", app_name=APP).describe.remote().result(timeout_s=10)


def _wait_llm_idle(cancelled_at_least: int, within_s: float):
    deadline = time.time() + within_s
    while True:
        d = _llm_description()
        if d.in_flight == 0 and d.cancelled >= cancelled_at_least:
            return d
        assert time.time() < deadline, f"the LLM still works for a request whose client left: {d}"
        time.sleep(0.2)


def test_a_client_that_goes_away_cancels_its_llm_call(client):
    """The client gives up after 1.5 s on an answer whose LLM call would take SLEEP_S: Serve cancels
    the request in the Ingress, the Reader and the LLMServer; the LLM is idle again long before the
    call would have ended, and the cancellation is counted."""
    before = _llm_description().cancelled
    t0 = time.time()
    with pytest.raises(httpx.ReadTimeout):
        client.post("/v1/answer", json={"question": f"[slow-read] {QUESTION}", "k": 2}, timeout=1.5)
    d = _wait_llm_idle(before + 1, within_s=6)
    assert time.time() - t0 < SLEEP_S - 4, "idle only once the call's own sleep ended"
    assert d.cancelled >= before + 1
    assert client.post("/v1/answer", json={"question": QUESTION, "k": 2}).status_code == 200


def test_the_request_deadline_header_shortens_it_and_cancels_the_read(client):
    before = _llm_description().cancelled
    r, took = _timed(client.post, "/v1/answer", json={"question": f"[slow-read] {QUESTION}", "k": 2},
                     headers={"X-Request-Timeout": "1.5"})
    err = _error(r, 504, "timeout", "read")
    assert err["detail"]["request_timeout_s"] == 1.5 and "X-Request-Timeout" in err["message"], err
    assert took < 1.5 + 2, took
    _wait_llm_idle(before + 1, within_s=6)
    r = client.post("/v1/retrieve", json={"question": QUESTION, "k": 2}, headers={"X-Request-Timeout": "soon"})
    assert r.status_code == 422 and "X-Request-Timeout" in r.json()["error"]["message"], r.text


def test_a_full_reader_sheds_at_the_door_and_retrieve_still_serves(client):
    """READER_LIMIT slow answers hold the reader; the next answer and chat get 503 with Retry-After
    at once (no retrieval runs for them), /v1/retrieve is served meanwhile, and once the slow ones
    end (their own 6 s deadline) an answer is admitted again. (At once: well within the held
    answers' deadline, which a queued request would wait out; a loaded 2-core machine takes ~1 s.)"""
    from concurrent.futures import ThreadPoolExecutor

    def slow(_):
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=30) as c:
            return c.post("/v1/answer", json={"question": f"[slow-read] {QUESTION}", "k": 2},
                          headers={"X-Request-Timeout": "6"}).status_code

    with ThreadPoolExecutor(READER_LIMIT) as pool:
        held = [pool.submit(slow, i) for i in range(READER_LIMIT)]
        time.sleep(1.5)  # both admitted and reading
        for path, body in (("/v1/answer", {"question": QUESTION, "k": 2}),
                           ("/v1/chat/completions", {"model": "longrag", "messages": [
                               {"role": "user", "content": QUESTION}]})):
            r, took = _timed(client.post, path, json=body)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert took < 2.0, f"{path} refused after {took:.2f} s: not at the door"
            err = r.json()["error"]
            assert err["code"] == "overloaded" and "serve.max_reader_requests" in err["message"], err
            assert int(r.headers["Retry-After"]) >= 1 and err["detail"]["limit"] == READER_LIMIT, r.headers
        assert client.post("/v1/retrieve", json={"question": QUESTION, "k": 2}).status_code == 200
        assert [f.result() for f in held] == [504] * READER_LIMIT
    assert client.post("/v1/answer", json={"question": QUESTION, "k": 2}).status_code == 200
