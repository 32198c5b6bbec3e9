"""The Serve application's faults and lifecycle (``tests/serve/cluster_app.py``: cpu-cluster.yaml on
2 logical CPUs): the LLMServer replica killed mid-answer, shard replicas killed for good and
re-created, an unschedulable deployment reported instead of waited on, the index tier removed with
the app. The tests run in file order; the last one deletes the app."""

from __future__ import annotations

import time

import pytest
import yaml
from ray import serve

from serve.run import main as run_main
from tests.serve.cluster_app import APP, app_config, deployed, error_of

PORT = 8325
DASHBOARD_PORT = 8326


@pytest.fixture(scope="module")
def client(sample_index):
    with deployed(sample_index["uri"], PORT, DASHBOARD_PORT) as c:
        yield c


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
