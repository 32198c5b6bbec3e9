"""The Serve application over HTTP (``tests/serve/cluster_app.py``: cpu-cluster.yaml on 2 logical
CPUs): 200s with evidence and trace, 4xx for bad requests in one JSON error shape, one question
answered end to end by the real bundled models (MiniLM + SmolLM2 via llama.cpp), the long-document
endpoint, and a shared index tier; then, on the same deployment, its faults and lifecycle (the LLMServer
replica killed mid-answer, shard replicas killed for good, an unschedulable deployment, the app deleted
with its index tier), in file order, the last one deleting the app."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest
import ray
import yaml
from ray import serve

from serve.run import main as run_main
from tests.serve.cluster_app import APP, GOOD, app_config, deployed, error_of

pytestmark = pytest.mark.ray("a")  # starts a local Ray (tests/conftest.py)

PORT = 8323
DASHBOARD_PORT = 8324


@pytest.fixture(scope="module")
def client(sample_index):
    with deployed(sample_index["uri"], PORT, DASHBOARD_PORT) as c:
        yield c


def test_healthz_describes_the_build_and_its_redundancy(client, sample_index):
    body = client.get("/readyz").json()
    assert body["status"] == "ok", body
    assert body["build_id"] == sample_index["report"]["build_id"]
    assert body["shards"] == 2 and body["units"] == sample_index["report"]["counts"]["units"]
    assert body["chunks"] == sample_index["report"]["counts"]["chunks"]
    assert body["index"] == [{"shard": 0, "live": 2, "replicas": 2}, {"shard": 1, "live": 2, "replicas": 2}]
    assert body["redundancy"] == "shard 0: 2 of 2 replicas; shard 1: 2 of 2 replicas"
    assert body["deployments"] == {} and body["problems"] == []
    assert body["limits"] == {"max_question_chars": 2000, "max_k": 100, "default_k": 4}


def test_cpu_config_runs_within_two_cpus(client):
    """The whole app and its index tier were scheduled on 2 logical CPUs (the fixture got RUNNING)."""
    assert ray.cluster_resources()["CPU"] == 2
    st = serve.status().applications[APP]
    assert str(getattr(st.status, "value", st.status)) == "RUNNING"


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
    # the second turn takes the first turn's prompt (the units) from llama.cpp's cache
    assert trace["cached_prompt_tokens"] >= trace["context_tokens"] > 0
    assert "answer_fallback" in trace
    for stage in ("encode_ms", "retrieve_ms", "read_ms", "total_ms"):
        assert trace[stage] > 0
    assert body["coverage"]["degraded"] is False


@pytest.mark.slow
def test_playground_answers_with_the_real_models(client, tmp_path):
    """The web playground (GET /) in a real headless Chromium asks the real bundled models; the
    screenshot goes to tmp_path, and also to $LONGRAG_PLAYGROUND_SCREENSHOT when set (that is how
    docs/playground.png is made)."""
    from tests.browser import ask, browser_page

    base = f"http://127.0.0.1:{PORT}"
    with browser_page(tmp_path / "profile") as page:
        shown = ask(page, base, "Who wrote the novel Animal Farm?", k=2, timeout_s=300)
        shot = tmp_path / "playground.png"
        page.screenshot(path=str(shot), full_page=True)
        problems = page.problems
    if os.environ.get("LONGRAG_PLAYGROUND_SCREENSHOT"):
        Path(os.environ["LONGRAG_PLAYGROUND_SCREENSHOT"]).write_bytes(shot.read_bytes())
    assert not shown["error"], shown["status"]
    assert "orwell" in (shown["answer"] + " " + shown["long_answer"]).lower(), shown
    assert len(shown["units"]) == 2 and any("Animal Farm" in u["titles"] for u in shown["units"])
    assert any(u["used"] for u in shown["units"]) and all(u["best_chunk"] for u in shown["units"])
    assert {"encode", "retrieve", "read"} <= set(shown["stages"]), shown["stages"]
    assert shot.stat().st_size > 10_000 and problems == [], problems


def test_chat_completion_streams_the_real_reader_through_the_openai_client(client):
    """The official openai client against the app with the bundled reader: the short answer as
    content first (issue 39), then llama.cpp's tokens of the long answer stream through the
    LLMServer and Reader handles as reasoning_content deltas, reusing the documents' KV prefix, then
    [DONE] (the client stops there)."""
    import openai

    oai = openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="no-keys-configured", max_retries=0,
                        timeout=300)
    chunks = list(oai.chat.completions.create(
        model="longrag", stream=True, extra_body={"k": 2},
        messages=[{"role": "user", "content": "Who wrote the novel Animal Farm?"}]))
    reasoning = [c.choices[0].delta.model_extra.get("reasoning_content") for c in chunks]
    long_answer = "".join(r for r in reasoning if r)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert sum(1 for r in reasoning if r) > 3, reasoning  # streamed token by token, not in one piece
    assert content.strip() and "orwell" in (content + long_answer).lower()
    extra = chunks[-1].model_extra["longrag"]
    assert extra["long_answer"] == long_answer.strip() and extra["trace"]["completion_tokens"] > 0
    first_content = next(i for i, c in enumerate(chunks) if c.choices[0].delta.content)
    assert first_content < next(i for i, r in enumerate(reasoning) if r)
    assert extra["trace"]["long_answer_cached_tokens"] > 0  # the documents were evaluated once


@pytest.mark.parametrize(
    "payload, fragment",
    [
        ({"question": "", "k": 3}, "question"),
        ({"question": "   ", "k": 3}, "empty"),
        ({"question": "x" * 5000, "k": 3}, "limit is 2000"),
        ({"question": "Who?", "k": 0}, "k:"),
        ({"question": "Who?", "k": 10_000}, "k must be between 1 and 100"),
        ({"k": 3}, "question"),
        ({"question": "Who?", "k": "many"}, "k:"),
        ({"question": "Who?", "k": "5"}, "k: Input should be a valid integer"),  # strict: no coercion
        ({"question": "Who?", "k": 5.0}, "k:"),
        ({"question": "Who?", "k": True}, "k:"),
        ({"question": 42}, "question:"),
        ({"question": "Who?", "colour": "blue"}, "colour"),
    ],
)
def test_bad_requests_get_422_in_the_one_error_shape(client, payload, fragment):
    for path in ("/v1/retrieve", "/v1/answer"):
        err = error_of(client.post(path, json=payload), 422, "invalid_request")
        assert fragment in err["message"], (path, err)
        assert isinstance(err["detail"], list) and err["detail"], err


def _raw(client, path: str, body: str) -> httpx.Response:
    return client.post(path, content=body.encode("ascii"), headers={"content-type": "application/json"})


def test_lone_surrogate_is_refused_at_the_edge(client):
    """``"\\ud800"`` is valid JSON but not encodable text: 422 on every endpoint, not a 500."""
    for path in ("/v1/retrieve", "/v1/answer"):
        err = error_of(_raw(client, path, '{"question": "Who wrote \\ud800 Animal Farm?", "k": 2}'), 422,
                     "invalid_request")
        assert "question is not valid Unicode text: a lone surrogate \\ud800 at character 10" in err["message"], err
    err = error_of(_raw(client, "/v1/longcontext", '{"document": "Some text. More.", "question": "why \\ud800",'
                                                  ' "retriever": "sparse", "k": 2}'), 422, "invalid_request")
    assert "question is not valid Unicode text" in err["message"], err
    err = error_of(_raw(client, "/v1/longcontext", '{"document": "Bad \\udfff text. More.", "retriever": "mixpr",'
                                                  ' "k": 2}'), 422, "invalid_request")
    assert "document is not valid Unicode text" in err["message"], err


def test_one_bad_question_does_not_fail_the_good_ones_sent_with_it(client):
    """A bad and several good questions at once over HTTP: the bad one alone is refused."""

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT}", timeout=180) as ac:
            bad = ac.post("/v1/retrieve", content=b'{"question": "\\ud800", "k": 2}',
                          headers={"content-type": "application/json"})
            good = [ac.post("/v1/retrieve", json={"question": q, "k": 2}) for q in GOOD * 2]
            return await asyncio.gather(bad, *good)

    for _ in range(3):
        bad, *good = asyncio.run(burst())
        error_of(bad, 422, "invalid_request")
        assert [r.status_code for r in good] == [200] * len(good), [r.text for r in good if r.status_code != 200]


def test_query_encoder_batch_isolates_a_bad_item(client):
    """Past the edge: the QueryEncoder's @serve.batch gets a bad and many good questions in one
    batch; the bad one fails alone with a clear error, every good one gets its vector."""
    from serve.deployments import BadQuestion

    handle = serve.get_deployment_handle("QueryEncoder", app_name=APP)
    questions = GOOD * 3
    questions.insert(4, "Who wrote \ud800?")
    responses = [handle.encode.remote(q) for q in questions]
    for i, resp in enumerate(responses):
        if i == 4:
            with pytest.raises(BadQuestion, match="surrogate"):
                resp.result(timeout_s=120)
        else:
            assert len(resp.result(timeout_s=120)) == 384


def test_openapi_states_the_limits_and_the_error_shape(client):
    schema = client.get("/openapi.json").json()
    req = schema["components"]["schemas"]["RetrieveRequest"]
    assert req["additionalProperties"] is False and req["required"] == ["question"]
    q = req["properties"]["question"]
    assert (q["type"], q["minLength"], q["maxLength"], q["pattern"]) == ("string", 1, 2000, r"\S")
    (k_int,) = [o for o in req["properties"]["k"]["anyOf"] if o.get("type") == "integer"]
    assert (k_int["minimum"], k_int["maximum"]) == (1, 100)
    lc = schema["components"]["schemas"]["LongContextRequest"]["properties"]
    assert lc["document"]["x-max-bytes"] == 200000
    for path in ("/v1/retrieve", "/v1/answer", "/v1/longcontext"):
        responses = schema["paths"][path]["post"]["responses"]
        for status in ("422", "500", "503"):
            ref = responses[status]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorResponse"), (path, status, ref)
    assert "503" in schema["paths"]["/readyz"]["get"]["responses"]


def test_malformed_json_wrong_method_and_unknown_path_share_the_shape(client):
    err = error_of(client.post("/v1/answer", content=b"{not json", headers={"content-type": "application/json"}),
                 422, "invalid_request")
    assert "JSON" in err["message"]
    error_of(client.get("/v1/answer"), 405, "method_not_allowed")
    # CORS is off while serve.cors_origins is empty: no preflight, no allow-origin header
    pre = client.options("/v1/answer", headers={"Origin": "http://elsewhere.example",
                                                "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 405 and "access-control-allow-origin" not in pre.headers
    error_of(client.get("/v1/nothing-here"), 404, "not_found")
    assert client.get("/openapi.json").status_code == 200


def _hashhop(tokens=3000, hops=2, seed=0):
    from lab.synthetic import generate_hashhop

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


def test_longcontext_hybrid_runs_on_the_readers_own_device(client):
    sample = _hashhop(tokens=600)
    r = client.post("/v1/longcontext", json={"document": sample.document, "question": sample.question,
                                              "retriever": "hybrid", "k": 5, "retrieve_only": True})
    assert r.status_code == 200, r.text
    assert len(r.json()["chunks"]) == 5


def test_longcontext_answers_with_the_real_llm(client):
    sample = _hashhop(tokens=600)
    r = client.post("/v1/longcontext", json={"document": sample.document, "question": sample.question,
                                              "retriever": "sparse", "k": 8, "route": "local"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] and body["trace"]["prompt_tokens"] > 0


def test_longcontext_rejects_oversized_and_bad_requests(client):
    err = error_of(client.post("/v1/longcontext", json={"document": "word " * 60_000, "retriever": "mixpr", "k": 5}),
                 413, "payload_too_large")
    assert "limit" in err["message"]
    error_of(client.post("/v1/longcontext", json={"document": "   ", "retriever": "mixpr", "k": 5}), 422,
           "invalid_request")
    error_of(client.post("/v1/longcontext", json={"document": "A text.", "retriever": "bm25", "k": 5}), 422,
           "invalid_request")
    error_of(client.post("/v1/longcontext", json={"document": "A text.", "k": "5"}), 422, "invalid_request")


# ---------------------------------------------------------------- the index tier and its health
def test_retriever_replicas_share_one_index_application(client):
    """2 Retriever replicas x index.replicas=2: one application per build, ``index-<build_id>``, with a
    deployment of exactly 2 replicas per shard (not a copy of the index per Retriever replica)."""
    from serve.faults import serve_replicas
    from serve.index_app import index_app_name

    apps = serve.status().applications
    retrievers = apps[APP].deployments["Retriever"]
    assert {str(getattr(k, "value", k)): v for k, v in retrievers.replica_states.items()}.get("RUNNING") == 2
    index_app = index_app_name(client.get("/readyz").json()["build_id"])
    assert sorted(apps[index_app].deployments) == ["IndexBuild", "shard-0", "shard-1"], apps[index_app]
    assert [len(serve_replicas(index_app, f"shard-{s}")) for s in (0, 1)] == [2, 2]

# ------------------------------------------------------------------------------------- faults and lifecycle
# The same deployment, after the requests above: the LLMServer replica killed mid-answer, shard
# replicas killed for good and re-created, an unschedulable deployment reported instead of waited
# on, the index tier removed with the app. They run in file order; the last one deletes the app.
# (One module since issue 45: two modules deployed the same app twice, ~1.5 min each here.)


@pytest.mark.slow
def test_llm_replica_killed_mid_answer_gives_an_error_event_or_a_json_503_then_answers(client):
    """The LLMServer replica actor killed from outside while an answer is in flight. A streamed answer
    that already started ends with an error event naming the read stage; a plain answer is retried
    once by the ingress (it waits for Serve's replacement replica) or answered with a JSON 503, never
    a plain-text 500; the next request is answered."""
    import concurrent.futures
    import json

    from serve.faults import kill_serve_replica

    question = {"question": "Who wrote the novel Animal Farm?", "k": 2}
    events, name = [], None
    t0 = time.time()
    with client.stream("POST", "/v1/answer", json={**question, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))
                if name == "token" and sum(n == "token" for n, _ in events) == 1:
                    kill_serve_replica(APP, "LLMServer")
    names = [n for n, _ in events]
    assert names[0] == "retrieval" and "token" in names and names[-1] == "error", names
    err = events[-1][1]["error"]
    assert err["code"] == "unavailable" and err["detail"]["stage"] == "read", err
    assert "ActorDied" in err["message"] or "Unavailable" in err["message"], err
    assert time.time() - t0 < 120
    r = client.post("/v1/answer", json=question)  # Serve's replacement replica answers
    assert r.status_code == 200 and r.json()["answer"].strip(), r.text

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.post, "/v1/answer", json=question)
        llm = serve.get_deployment_handle("LLMServer", APP)
        deadline = time.time() + 120
        while llm.describe.remote().result(timeout_s=30).in_flight == 0:  # until the reader is reading
            assert time.time() < deadline and not pending.done(), "the answer never reached the LLM"
            time.sleep(0.05)
        in_flight = not pending.done()
        kill_serve_replica(APP, "LLMServer")
        r = pending.result(timeout=600)
    assert in_flight
    if r.status_code != 200:  # the retry failed too: a JSON 503 naming the stage
        error_of(r, 503, "unavailable")
        assert r.json()["error"]["detail"]["stage"] == "read", r.text
    else:
        assert r.json()["trace"].get("read_retries") == 1, r.text
    r = client.post("/v1/answer", json=question)
    assert r.status_code == 200 and r.json()["answer"].strip(), r.text


def _index_app() -> str:
    """The name of the (one) index application running beside the app."""
    (name,) = [a for a in serve.status().applications if a.startswith("index-")]
    return name


def test_shard_replicas_killed_for_good_are_replaced_and_no_request_fails(client):
    """One replica of every shard deployment killed for good from outside (``no_restart``) while a
    burst runs on both Retriever replicas: every request is answered in full (the other replica, or
    a second try), Serve starts new replicas, /readyz and the responses come back to "2 of 2", and
    Serve keeps the same Retriever replicas throughout."""
    from concurrent.futures import ThreadPoolExecutor

    from serve.faults import kill_index_replicas, serve_replicas

    index_app = _index_app()
    build_id = index_app.removeprefix("index-")
    before = sorted(serve_replicas(APP, "Retriever"))
    assert len(before) == 2
    killed = [name for shard in (0, 1) for name in kill_index_replicas(build_id, shard, 1)]
    assert len(killed) == 2
    with ThreadPoolExecutor(8) as pool:  # at once, on both Retriever replicas
        burst = list(pool.map(lambda _: client.post("/v1/retrieve", json={"question": "Who wrote Animal Farm?",
                                                                            "k": 2}), range(16)))
    statuses = [r.status_code for r in burst]
    assert all(r.json()["coverage"]["answered"] == 2 for r in burst if r.status_code == 200)
    full = "shard 0: 2 of 2 replicas; shard 1: 2 of 2 replicas"
    deadline = time.time() + 180
    while True:
        r = client.post("/v1/retrieve", json={"question": "Who wrote the novel Animal Farm?", "k": 2})
        statuses.append(r.status_code)
        if r.status_code == 200:
            cov = r.json()["coverage"]
            assert cov["answered"] == 2 and not cov["degraded"], cov
        body = client.get("/readyz").json()
        # Serve's counts lag a kill by up to its health-check period (they may still say 2 of 2 just
        # after it): done when /readyz says so and both replicas of each shard are new or untouched
        new = {s: {name for name, _ in serve_replicas(index_app, f"shard-{s}")} for s in (0, 1)}
        if body["status"] == "ok" and body["redundancy"] == full and [len(new[s]) for s in (0, 1)] == [2, 2]:
            break
        assert time.time() < deadline, (body, new)
        time.sleep(0.5)
    assert set(statuses) == {200}, statuses
    assert not set(killed) & (new[0] | new[1]), (killed, new)
    # Each Retriever replica reads Serve's counts again at its own next health check (every 10 s
    # here): the responses' redundancy may lag /readyz by about that period; 60 s allows for a check
    # that starts late on a loaded machine.
    deadline, streak = time.time() + 60, 0
    while streak < 4:  # four full answers in a row: both Retriever replicas know
        r = client.post("/v1/retrieve", json={"question": "Who wrote the novel Animal Farm?", "k": 2})
        assert r.status_code == 200, r.text
        streak = streak + 1 if r.json()["coverage"]["redundancy"] == full else 0
        assert time.time() < deadline, r.text
        time.sleep(0.25)
    assert sorted(serve_replicas(APP, "Retriever")) == before  # Serve replaced none

def test_unschedulable_deployment_shows_in_healthz_and_fails_the_deploy(client, sample_index, tmp_path, capsys):
    """A Reader asking for 3 CPUs on a 2-CPU Ray: `python -m serve.run` (make serve) exits 1 naming
    the missing resources instead of waiting forever, and /readyz lists the Reader with them."""
    config = tmp_path / "cpu-reader-3cpus.yaml"
    config.write_text(yaml.safe_dump(app_config(sample_index["uri"], PORT, reader_cpus=3)))
    assert run_main([str(config), "--non-blocking", "--ready-timeout-s", "180"]) == 1
    err = capsys.readouterr().err
    assert "FAILED" in err and "deployment 'Reader' lacks {'CPU': 3.0}" in err, err
    r = client.get("/readyz")
    health = r.json() if r.status_code == 200 else error_of(r, 503, "unavailable")["detail"]
    assert health["status"] != "ok"
    reader = health["deployments"]["Reader"]
    assert reader["missing_resources"] == {"CPU": 3.0} and "Resources required" in reader["message"], health
    assert any(p.startswith("Reader:") and "lacks" in p for p in health["problems"]), health


def test_deleting_the_app_removes_its_index_application(client):
    """The index application's lifetime: the last Retriever replica to stop deletes it."""
    index_app = _index_app()
    serve.delete(APP)
    deadline = time.time() + 60
    while index_app in serve.status().applications:
        assert time.time() < deadline, serve.status().applications[index_app]
        time.sleep(1)
