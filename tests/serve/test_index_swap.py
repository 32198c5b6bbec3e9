"""A running app over a build alias switches to a newly published build with no failed request:
the real deployments and ingress over the fakes of tests/fakes.py (in-process shards of tiny builds,
a hashing encoder, a scripted reader), a bounded query loop running through the switch."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import httpx
import pytest
import ray
from ray import serve

from cluster.local import WORKER_ENV
from longrag.config import LongRAGConfig
from longrag.index.alias import publish
from longrag.index.artifacts import ArtifactStore
from serve.app import build_app
from tests.fakes import FakeShardsIndex, HashEncoder, TitleReader, write_tiny_build
from tests.serve.test_app_fakes import DOCS, serve_status_wait

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
PORT = 8430
NEW_DOC = ("Zanzibar", "Zanzibar is an island off the coast of Tanzania. Its capital is Stone Town.")


@contextlib.contextmanager
def ray_serve(namespace: str, port: int):
    """One local Ray (4 logical CPUs, this repository on the workers' path) and Serve on ``port``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=4, include_dashboard=False, namespace=namespace,
             runtime_env={"env_vars": {**WORKER_ENV, "PYTHONPATH": path}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    alias = tmp_path_factory.mktemp("alias")
    first = write_tiny_build(alias / "builds" / "first", DOCS, shards=2)
    publish(str(alias), first)
    with ray_serve("longrag-swap", PORT):
        cfg = LongRAGConfig().with_overrides(["index.refresh_s=0.5", "serve.readyz_cache_s=0"])
        app = build_app(cfg, str(alias), encoder_cls=HashEncoder, index_cls=FakeShardsIndex, engine_cls=TitleReader)
        serve.run(app, name="swap", route_prefix="/", blocking=False)
        serve_status_wait(["swap"])
        yield alias, ArtifactStore.open(first).read_manifest().build_id


def wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.05)


def swap_under_load(port: int, alias: Path, first_id: str) -> tuple[list[tuple[int, str | None, list[str]]], str]:
    """Three clients query the app on ``port`` while a second build (the first's documents and
    NEW_DOC) is published behind ``alias``, until the app has answered 10 queries from it; returns
    every ``(status, build id, titles)`` and the new build's id."""
    results: list[tuple[int, str | None, list[str]]] = []
    stop = threading.Event()

    def loop() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            while not stop.is_set() and len(results) < 2000:  # bounded
                r = c.post("/v1/retrieve", json={"question": "Which island is off Tanzania?", "k": 1})
                body = r.json() if r.status_code == 200 else {}
                results.append((r.status_code, body.get("trace", {}).get("retrieve.build_id"),
                                [t for u in body.get("units", []) for t in u["titles"]]))

    workers = [threading.Thread(target=loop) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        wait_for(lambda: len(results) >= 10, "queries on the first build")
        second = write_tiny_build(alias / "builds" / "second", [*DOCS, NEW_DOC], shards=2)
        second_id = ArtifactStore.open(second).read_manifest().build_id
        publish(str(alias), second, expect_build_id=first_id)
        wait_for(lambda: any(b == second_id for _, b, _ in results[-5:]), "the switch to the published build", 180)
        wait_for(lambda: sum(b == second_id for _, b, _ in results) >= 10, "more queries on the new build")
    finally:
        stop.set()
        for w in workers:
            w.join()
    return results, second_id


def test_publishing_a_new_build_switches_with_no_failed_request(served):
    alias, first_id = served
    results, second_id = swap_under_load(PORT, alias, first_id)
    codes = [c for c, _, _ in results]
    assert codes.count(200) == len(codes), [c for c in codes if c != 200][:5]
    builds = [b for _, b, _ in results]
    assert set(builds) == {first_id, second_id} and builds.count(first_id) > 3
    after = [titles for _, b, titles in results if b == second_id]
    assert after and all(t == ["Zanzibar"] for t in after)  # only the new build holds it
    assert all(t != ["Zanzibar"] for _, b, t in results if b == first_id)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as c:
        assert c.get("/readyz").json()["build_id"] == second_id
