"""The Serve application over HTTP, deployed from ``serve/configs/cpu-cluster.yaml`` (the cluster profile) the way ``make serve``
deploys it, on a Ray with 2 logical CPUs (the 2-core machine the README promises): 200s with
evidence and trace, 4xx for bad requests in one JSON error shape, one question answered end to
end by the real bundled models (MiniLM + SmolLM2 via llama.cpp), a shared index tier, health
that survives a dead replica, and an unschedulable deployment reported instead of waited on.

The tests run in file order; the last ones kill shard replicas, redeploy and delete the app."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
import yaml
from ray import serve
from ray.util.state import list_actors

from actors.index_shard import IndexShardImpl
from cluster.local import start_or_join
from serve.run import deploy, wait_running
from serve.run import main as run_main
from serve.run import wait_healthy

SHARD_CLASS = IndexShardImpl.__name__  # the class name Ray records for IndexShard actors
PORT = 8323
DASHBOARD_PORT = 8324  # the state API (list_actors) needs the dashboard
APP = "longrag"
CPU_YAML = Path(__file__).resolve().parents[2] / "serve" / "configs" / "cpu-cluster.yaml"
GOOD = ["Who wrote the novel Animal Farm?", "What is the capital of Angola?", "Who composed An American in Paris?",
        "Which spaceflight first landed humans on the Moon?", "Which country is Aruba part of?"]


def _config(index_uri: str, reader_cpus: float | None = None) -> dict[str, Any]:
    """cpu-cluster.yaml with the test's build and port, 2 fixed Retriever replicas (health checked every 10 s,
    Serve's default: the tier re-creates a dead shard replica at a Retriever health check)."""
    config = yaml.safe_load(CPU_YAML.read_text())
    config["http_options"]["port"] = PORT
    (app,) = config["applications"]
    app["args"]["index"] = index_uri
    app["args"]["overrides"] = [*app["args"].get("overrides", []), "mixpr.max_document_bytes=200000"]
    for dep in app["deployments"]:
        if dep["name"] == "Retriever":
            dep.pop("autoscaling_config", None)
            dep.update(num_replicas=2, health_check_period_s=10, health_check_timeout_s=30)
        if dep["name"] == "Reader" and reader_cpus is not None:
            dep["ray_actor_options"] = {"num_cpus": reader_cpus}
    return config


def _actors(class_name: str) -> list[Any]:
    # this module's dashboard, named: auto-detection fails when another Ray runs on the machine
    return list_actors(address=f"http://127.0.0.1:{DASHBOARD_PORT}", limit=1000,
                       filters=[("class_name", "=", class_name), ("state", "=", "ALIVE")])


@pytest.fixture(scope="module")
def client(sample_index):
    old = os.environ.get("RAY_SERVE_SLOW_STARTUP_WARNING_S")
    os.environ["RAY_SERVE_SLOW_STARTUP_WARNING_S"] = "10"  # Serve reports unschedulable replicas sooner
    handle = start_or_join(None, num_cpus=2, include_dashboard=True, dashboard_port=DASHBOARD_PORT)
    try:
        deploy(_config(sample_index["uri"]))
        # schedule_timeout_s: on a loaded machine replicas that are placed but whose workers start
        # slowly are reported "taken more than 10s to be scheduled" (with the free CPUs net of them)
        reason = wait_running([APP], schedule_timeout_s=120, ready_timeout_s=420)
        assert reason is None, reason
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=180) as c:
            wait_healthy(c)
            yield c
    finally:
        serve.shutdown()
        handle.shutdown()
        if old is None:
            os.environ.pop("RAY_SERVE_SLOW_STARTUP_WARNING_S", None)
        else:
            os.environ["RAY_SERVE_SLOW_STARTUP_WARNING_S"] = old


def _error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """Every error has one JSON shape: {"error": {"code", "message", "detail"}}."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}, body
    assert body["error"]["code"] == code and body["error"]["message"], body
    return body["error"]


def test_healthz_describes_the_build_and_its_redundancy(client, sample_index):
    body = client.get("/healthz").json()
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
    """The official openai client against the app with the bundled reader: llama.cpp's tokens of
    the long answer stream through the LLMServer and Reader handles as reasoning_content deltas,
    then the short answer as content, then [DONE] (the client stops there)."""
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
        _error(r, 503, "unavailable")
        assert r.json()["error"]["detail"]["stage"] == "read", r.text
    else:
        assert r.json()["trace"].get("read_retries") == 1, r.text
    r = client.post("/v1/answer", json=question)
    assert r.status_code == 200 and r.json()["answer"].strip(), r.text


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
        err = _error(client.post(path, json=payload), 422, "invalid_request")
        assert fragment in err["message"], (path, err)
        assert isinstance(err["detail"], list) and err["detail"], err


def _raw(client, path: str, body: str) -> httpx.Response:
    return client.post(path, content=body.encode("ascii"), headers={"content-type": "application/json"})


def test_lone_surrogate_is_refused_at_the_edge(client):
    """``"\\ud800"`` is valid JSON but not encodable text: 422 on every endpoint, not a 500."""
    for path in ("/v1/retrieve", "/v1/answer"):
        err = _error(_raw(client, path, '{"question": "Who wrote \\ud800 Animal Farm?", "k": 2}'), 422,
                     "invalid_request")
        assert "question is not valid Unicode text: a lone surrogate \\ud800 at character 10" in err["message"], err
    err = _error(_raw(client, "/v1/longcontext", '{"document": "Some text. More.", "question": "why \\ud800",'
                                                  ' "retriever": "sparse", "k": 2}'), 422, "invalid_request")
    assert "question is not valid Unicode text" in err["message"], err
    err = _error(_raw(client, "/v1/longcontext", '{"document": "Bad \\udfff text. More.", "retriever": "mixpr",'
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
        _error(bad, 422, "invalid_request")
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
    assert "503" in schema["paths"]["/healthz"]["get"]["responses"]


def test_malformed_json_wrong_method_and_unknown_path_share_the_shape(client):
    err = _error(client.post("/v1/answer", content=b"{not json", headers={"content-type": "application/json"}),
                 422, "invalid_request")
    assert "JSON" in err["message"]
    _error(client.get("/v1/answer"), 405, "method_not_allowed")
    # CORS is off while serve.cors_origins is empty: no preflight, no allow-origin header
    pre = client.options("/v1/answer", headers={"Origin": "http://elsewhere.example",
                                                "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 405 and "access-control-allow-origin" not in pre.headers
    _error(client.get("/v1/nothing-here"), 404, "not_found")
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
    err = _error(client.post("/v1/longcontext", json={"document": "word " * 60_000, "retriever": "mixpr", "k": 5}),
                 413, "payload_too_large")
    assert "limit" in err["message"]
    _error(client.post("/v1/longcontext", json={"document": "   ", "retriever": "mixpr", "k": 5}), 422,
           "invalid_request")
    _error(client.post("/v1/longcontext", json={"document": "A text.", "retriever": "bm25", "k": 5}), 422,
           "invalid_request")
    _error(client.post("/v1/longcontext", json={"document": "A text.", "k": "5"}), 422, "invalid_request")


# ---------------------------------------------------------------- the index tier and its health
def test_retriever_replicas_share_one_index_tier(client):
    """2 Retriever replicas x index.replicas=2: exactly 2 IndexShard actors per shard, named after the build."""
    retrievers = serve.status().applications[APP].deployments["Retriever"]
    assert {str(getattr(k, "value", k)): v for k, v in retrievers.replica_states.items()}.get("RUNNING") == 2
    shards = _actors(SHARD_CLASS)
    assert len(shards) == 4, [(a.name, a.ray_namespace) for a in shards]
    assert {a.ray_namespace for a in shards} == {f"longrag-index-{APP}"}
    names = sorted(a.name for a in shards)
    build_id = client.get("/healthz").json()["build_id"]
    assert all(n.startswith(build_id) for n in names), names
    assert [n.rsplit("-", 2)[-2:] for n in names] == [["s0", "r0"], ["s0", "r1"], ["s1", "r0"], ["s1", "r1"]]


def test_replicas_killed_for_good_are_recreated_and_reported_meanwhile(client):
    """Replica 0 of every shard killed for good from outside (``no_restart``: as after its fourth
    crash). Replica 1 serves every request; /healthz and the responses' coverage say "1 of 2" until
    the tier has re-created the replicas under their names (at a Retriever health check, every 10 s
    here) and they have loaded; Serve keeps the same Retriever replicas throughout."""
    from concurrent.futures import ThreadPoolExecutor

    from serve.faults import kill_shard_replicas, serve_replicas, shard_actors

    before = sorted(serve_replicas(APP, "Retriever"))
    assert len(before) == 2
    old = {key: ray.get_actor(*where)._actor_id for key, where in shard_actors(APP).items()}
    killed = [name for shard in (0, 1) for name in kill_shard_replicas(APP, shard, [0])]
    assert all(n.endswith("-r0") for n in killed) and len(killed) == 2
    with ThreadPoolExecutor(8) as pool:  # at once, on both Retriever replicas: each meets the dead replicas
        burst = list(pool.map(lambda _: client.post("/v1/retrieve", json={"question": "Who wrote Animal Farm?",
                                                                            "k": 2}), range(16)))
    # The burst met the dead replicas, so its responses say "1 of 2"; /healthz may already say "ok":
    # the tier re-creates the replicas at its next health check (0-10 s after the kill) and they
    # load in about a second, which can fall inside the burst on a loaded machine.
    seen_health, seen_coverage, statuses = set(), set(), [r.status_code for r in burst]
    seen_coverage |= {r.json()["coverage"]["redundancy"] for r in burst if r.status_code == 200}
    assert any("1 of 2" in c for c in seen_coverage), seen_coverage
    deadline = time.time() + 180
    while True:
        r = client.post("/v1/retrieve", json={"question": "Who wrote the novel Animal Farm?", "k": 2})
        statuses.append(r.status_code)
        if r.status_code == 200:
            cov = r.json()["coverage"]
            assert cov["answered"] == 2 and not cov["degraded"], cov
            seen_coverage.add(cov["redundancy"])
        body = client.get("/healthz").json()
        seen_health.add(body["redundancy"])
        if body["status"] == "ok":
            break
        assert time.time() < deadline, (seen_health, seen_coverage)
        time.sleep(0.5)
    assert set(statuses) == {200}, statuses
    full = "shard 0: 2 of 2 replicas; shard 1: 2 of 2 replicas"
    assert body["redundancy"] == full, body
    new = {key: ray.get_actor(*where)._actor_id for key, where in shard_actors(APP).items()}
    assert set(new) == set(old) and all(new[(s, 0)] != old[(s, 0)] for s in (0, 1)), (old, new)
    assert all(new[(s, 1)] == old[(s, 1)] for s in (0, 1))
    # Each Retriever replica learns of the re-created replicas at its own next health check (every
    # 10 s here): the responses' redundancy may lag /healthz by about that period; 60 s allows for a
    # check that starts late on a loaded machine (one CI run missed 30 s at load average 14).
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
    the missing resources instead of waiting forever, and /healthz lists the Reader with them."""
    config = tmp_path / "cpu-reader-3cpus.yaml"
    config.write_text(yaml.safe_dump(_config(sample_index["uri"], reader_cpus=3)))
    assert run_main([str(config), "--non-blocking", "--ready-timeout-s", "180"]) == 1
    err = capsys.readouterr().err
    assert "FAILED" in err and "deployment 'Reader' lacks {'CPU': 3.0}" in err, err
    r = client.get("/healthz")
    health = r.json() if r.status_code == 200 else _error(r, 503, "unavailable")["detail"]
    assert health["status"] != "ok"
    reader = health["deployments"]["Reader"]
    assert reader["missing_resources"] == {"CPU": 3.0} and "Resources required" in reader["message"], health
    assert any(p.startswith("Reader:") and "lacks" in p for p in health["problems"]), health


def test_deleting_the_app_removes_its_index_tier(client):
    """The shared tier's lifetime: the last Retriever replica to stop releases it."""
    assert _actors(SHARD_CLASS)
    serve.delete(APP)
    deadline = time.time() + 60
    while _actors(SHARD_CLASS):
        assert time.time() < deadline, [a.name for a in _actors(SHARD_CLASS)]
        time.sleep(1)
