"""The shard tier as Serve deployments (serve/index_app.py): the real app
(deployments, ingress, Retriever) over a tiny build whose shards are one Serve application,
``index-<build_id>``, of 2 shard deployments x 2 replicas; a hashing encoder and a scripted reader
(tests/fakes.py). Exactness against the in-process index, a replica killed under load (no failed
request, coverage "1 of 2", back to "2 of 2" by Serve alone), and the swap to a new build over an
alias (no failed request, the old build's application deleted after ``index.retire_after_s``)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import ray
from ray import serve

from actors.inprocess_index import InProcessIndex
from longrag.config import LongRAGConfig
from longrag.index.alias import publish
from longrag.index.artifacts import ArtifactStore
from serve.app import build_app
from serve.index_app import index_app_name, shard_deployment_name
from tests.fakes import HashEncoder, TitleReader, write_tiny_build
from tests.serve.test_app_fakes import DOCS, serve_status_wait
from tests.serve.test_index_swap import ray_serve, swap_under_load

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)

PORT = 8440
QUESTIONS = ["Who wrote the novel Animal Farm?", "What is the capital of Angola?", "Which spaceflight landed on the Moon?",
             "Which country lies within the Kingdom of the Netherlands?", "Who composed Rhapsody in Blue?"]
OVERRIDES = ["index.replicas=2", "index.shard_num_cpus=0.1", "index.refresh_s=0.5",
             "index.retire_after_s=15", "serve.readyz_cache_s=0"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    alias = tmp_path_factory.mktemp("alias")
    first = write_tiny_build(alias / "builds" / "first", DOCS, shards=2)
    publish(str(alias), first)
    with ray_serve("longrag-serve-index", PORT):
        cfg = LongRAGConfig().with_overrides(OVERRIDES)
        app = build_app(cfg, str(alias), encoder_cls=HashEncoder, index_cls=None, engine_cls=TitleReader)
        serve.run(app, name="served", route_prefix="/", blocking=False)
        serve_status_wait(["served"], timeout_s=180)
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as client:
            yield client, alias, first, cfg


def _replicas(app: str, deployment: str) -> dict[str, int]:
    dep = serve.status().applications[app].deployments[deployment]
    return {str(getattr(k, "value", k)): n for k, n in dep.replica_states.items() if n}


def _wait_for(condition, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.1)


def test_shards_are_one_serve_application_and_search_exactly(served):
    client, _, first, cfg = served
    build_id = ArtifactStore.open(first).read_manifest().build_id
    app = index_app_name(build_id)
    for s in (0, 1):
        assert _replicas(app, shard_deployment_name(s)) == {"RUNNING": 2}
    local = InProcessIndex(first, cfg.index)
    for q in QUESTIONS:
        body = client.post("/v1/retrieve", json={"question": q, "k": 3}).json()
        want = local.search_sync(HashEncoder().encode_queries([q]), 3).hits[0]
        assert [(u["unit_id"], round(u["score"], 5)) for u in body["units"]] == \
            [(h.unit_id, round(h.score, 5)) for h in want]
        assert body["coverage"]["redundancy"] == "shard 0: 2 of 2 replicas; shard 1: 2 of 2 replicas"
        hybrid = client.post("/v1/retrieve", json={"question": q, "k": 3, "mode": "hybrid"}).json()
        got = local.search_sync(HashEncoder().encode_queries([q]), 3, [q], None).hits[0]
        assert [u["unit_id"] for u in hybrid["units"]] == [h.unit_id for h in got]
    ready = client.get("/readyz").json()
    assert ready["build_id"] == build_id


def test_a_replica_killed_under_load_fails_no_request_and_serve_replaces_it(served):
    client, _, first, _ = served
    app = index_app_name(ArtifactStore.open(first).read_manifest().build_id)
    results: list[int] = []
    redundancy: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as c:
            i = 0
            while not stop.is_set() and len(results) < 3000:  # bounded
                r = c.post("/v1/retrieve", json={"question": QUESTIONS[i % len(QUESTIONS)], "k": 2})
                results.append(r.status_code)
                if r.status_code == 200:
                    redundancy.append(r.json()["coverage"]["redundancy"])
                i += 1

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if f"{app}#{shard_deployment_name(0)}#" in a["name"]]
    assert len(names) == 2, names
    workers = [threading.Thread(target=loop) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        _wait_for(lambda: len(results) >= 20, "requests before the kill")
        ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
        _wait_for(lambda: any("shard 0: 1 of 2" in r for r in redundancy[-50:]) or
                  _replicas(app, shard_deployment_name(0)) != {"RUNNING": 2}, "Serve to see the lost replica")
        _wait_for(lambda: _replicas(app, shard_deployment_name(0)) == {"RUNNING": 2}, "Serve to replace it")
        n = len(results)
        _wait_for(lambda: len(results) >= n + 20, "requests after the replacement")
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert results.count(200) == len(results), [c for c in results if c != 200][:5]
    # the Retriever re-reads Serve's counts on its health check (every 10 s): full redundancy shows then
    full = "shard 0: 2 of 2 replicas; shard 1: 2 of 2 replicas"
    _wait_for(lambda: client.post("/v1/retrieve", json={"question": QUESTIONS[0], "k": 2}).json()["coverage"][
        "redundancy"] == full, "responses to say full redundancy again", 60)


def test_the_swap_to_a_new_build_fails_no_request_and_retires_the_old_application(served):
    _, alias, first, _ = served
    first_id = ArtifactStore.open(first).read_manifest().build_id
    results, second_id = swap_under_load(PORT, alias, first_id)
    codes = [c for c, _, _ in results]
    assert codes.count(200) == len(codes), [c for c in codes if c != 200][:5]
    assert {b for _, b, _ in results} == {first_id, second_id}
    apps = lambda: set(serve.status().applications)  # noqa: E731
    assert index_app_name(second_id) in apps()
    _wait_for(lambda: index_app_name(first_id) not in apps(), "the old build's application to be deleted", 60)


def test_a_shard_deployment_scales_1_to_2_to_1_under_a_burst(served, tmp_path):
    """index.autoscaling: a shard deployment of 1 replica grows to 2 while a burst keeps more
    searches in flight than the target, and shrinks back to 1 after it (Serve's autoscaler alone)."""
    import asyncio

    import numpy as np

    from lab.synthetic.vectors import write_synthetic_build
    from serve.index_app import ServeShards, ensure_index_app

    write_synthetic_build(str(tmp_path), [150_000], dim=64, chunk_chars=20, chunks_per_unit=4, seed=0)
    manifest = ArtifactStore.open(str(tmp_path)).read_manifest()
    config = LongRAGConfig().with_overrides(["index.shard_num_cpus=0.1"]).index
    config = config.model_copy(update={"autoscaling": {
        "min_replicas": 1, "max_replicas": 2, "initial_replicas": 1, "target_ongoing_requests": 1,
        "metrics_interval_s": 0.5, "look_back_period_s": 2, "upscale_delay_s": 1, "downscale_delay_s": 3}})
    app = ensure_index_app(str(tmp_path), manifest, config, ready_timeout_s=180)
    shard = shard_deployment_name(0)
    assert _replicas(app, shard) == {"RUNNING": 1}
    shards = ServeShards(app, manifest, config)
    queries = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    stop = threading.Event()
    failures: list[str] = []

    def burst() -> None:
        async def one_client() -> None:
            while not stop.is_set():
                res = await shards.search(queries, 5)
                if res.coverage.degraded:
                    failures.append(str(res.coverage.errors))

        async def clients() -> None:
            await asyncio.gather(*(one_client() for _ in range(6)))

        asyncio.run(clients())

    loader = threading.Thread(target=burst)
    loader.start()
    try:
        _wait_for(lambda: _replicas(app, shard).get("RUNNING", 0) == 2, "the burst to add a replica", 120)
    finally:
        stop.set()
        loader.join()
    _wait_for(lambda: _replicas(app, shard) == {"RUNNING": 1}, "the quiet to remove it", 120)
    assert not failures, failures[:3]
    serve.delete(app)


def test_a_rollback_within_retire_after_s_keeps_the_live_build(served, tmp_path):
    """Issue 40, item 2b on real Serve: the alias rolled back within ``index.retire_after_s`` of a
    switch; the Retriever adopts the retiring build's application again, and the retirement of it
    (its holder's, :class:`serve.index_app.IndexHolders`) does not delete it: it keeps answering with
    every shard, past the retirement's deadline. (The holders' logic without Serve:
    tests/serve/test_index_holders.py.)"""
    from longrag.index.alias import read_pointer

    client, alias, first, cfg = served
    builds = {ArtifactStore.open(str(p)).read_manifest().build_id: str(p) for p in (alias / "builds").iterdir()}
    if len(builds) < 2:  # run alone: a second build to switch between
        second = write_tiny_build(alias / "builds" / "second", DOCS[:-1], shards=2)
        builds[ArtifactStore.open(second).read_manifest().build_id] = second
    # the Retriever's own refresh (what its index.refresh_s timer runs) returns once it serves the
    # build: the switch is seen when the retirement starts, not a loaded /readyz (10-17 s) later
    retriever = serve.get_deployment_handle("Retriever", app_name="served")
    live = read_pointer(str(alias)).build_id
    other = next(b for b in builds if b != live)
    publish(str(alias), builds[other], expect_build_id=live)
    _wait_for(lambda: retriever.refresh.remote().result(timeout_s=120) == other, "the switch", 180)
    switched = time.monotonic()  # the live build's retirement started: its hold ends retire_after_s later
    publish(str(alias), builds[live], expect_build_id=other)  # rolled back at once: within retire_after_s
    _wait_for(lambda: retriever.refresh.remote().result(timeout_s=120) == live, "the switch back", 60)
    took = time.monotonic() - switched
    assert took < cfg.index.retire_after_s, \
        f"the rollback was adopted {took:.1f} s after the switch, past retire_after_s: the test's premise failed"
    assert client.get("/readyz").json().get("build_id") == live
    time.sleep(cfg.index.retire_after_s - took + 2.0)  # past the first retirement's deadline
    assert index_app_name(live) in serve.status().applications, "the live build's application was deleted"
    for q in QUESTIONS[:3]:
        r = client.post("/v1/retrieve", json={"question": q, "k": 2})
        assert r.status_code == 200 and not r.json()["coverage"]["degraded"], r.text[:300]
    _wait_for(lambda: index_app_name(other) not in serve.status().applications,
              "the superseded build's application to be deleted", 60)


def test_a_new_retriever_replica_accepts_an_application_that_lost_a_replica(monkeypatch, tmp_path):
    """UNHEALTHY while Serve replaces a lost replica, every shard still with a running one: a
    Retriever replica starting then (the burst's scale-up after a node loss) serves from it instead
    of failing; a shard with none is waited for, then named."""
    from types import SimpleNamespace

    from serve import index_app as ia
    from serve import status as run

    write_tiny_build(tmp_path / "b", DOCS, shards=2)
    manifest = ArtifactStore.open(str(tmp_path / "b")).read_manifest()
    name = index_app_name(manifest.build_id)

    def status(running: list[int]) -> SimpleNamespace:
        deps = {shard_deployment_name(s): SimpleNamespace(replica_states={"RUNNING": n, "STARTING": 2 - n})
                for s, n in enumerate(running)}
        return SimpleNamespace(applications={name: SimpleNamespace(status="UNHEALTHY", deployments=deps)})

    deployed: list[str] = []
    monkeypatch.setattr(ia.ray_private, "serve_run_nowait", lambda *a, **k: deployed.append(k["name"]))
    monkeypatch.setattr(run, "wait_running", lambda *a, **k: f"application '{name}' is UNHEALTHY")
    monkeypatch.setattr(run, "serve_status", lambda: status([1, 2]))
    assert ia.ensure_index_app(str(tmp_path / "b"), manifest, LongRAGConfig().index) == name and not deployed
    monkeypatch.setattr(run, "serve_status", lambda: status([0, 2]))
    with pytest.raises(ia.IndexNotReady, match="is UNHEALTHY"):
        ia.ensure_index_app(str(tmp_path / "b"), manifest, LongRAGConfig().index, ready_timeout_s=2)
    assert not deployed
