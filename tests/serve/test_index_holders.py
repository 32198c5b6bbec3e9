"""Who holds an index application (issue 40, items 2b and 2c), without Ray: :class:`serve.index_app.ServeIndex`
over Serve fakes (the application's deployment and handles faked, ``serve.delete`` recorded) and the
holder registry in process.

* 2b: a Retriever replica retires a build's application (``retire_after_s`` later) and the alias is rolled
  back within that window: the replica adopts the running application again, and the retirement's timer
  must not delete it.
* 2c: two holders of one build (two Serve apps' Retrievers, or a Retriever and an evaluation job): the
  application goes only with the last of them to release it.
* issue 44, item 3.1: a superseded build's application is released on every path: by the Retriever
  replica's shutdown while it still retires, and by the registry's next call of any kind once its
  holder's actor is dead."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from ray import serve

from longrag.config import LongRAGConfig
from longrag.index.artifacts import ArtifactStore
from serve import index_app as ia
from tests.fakes import write_tiny_build

pytestmark = pytest.mark.timeout(60)
DOCS = [("Angola", "Luanda is the capital of Angola."), ("Orwell", "George Orwell wrote Animal Farm.")]


@pytest.fixture
def build(tmp_path) -> tuple[str, str]:
    uri = write_tiny_build(tmp_path / "b", DOCS, shards=1)
    return uri, ia.index_app_name(ArtifactStore.open(uri).read_manifest().build_id)


@pytest.fixture
def deleted(monkeypatch) -> list[str]:
    """Serve faked: the build's application runs, handles are placeholders, deletions are recorded;
    the holder registry runs in this process."""
    from serve import status

    gone: list[str] = []
    monkeypatch.setattr(ia, "ensure_index_app", lambda uri, manifest, config, **kw: ia.index_app_name(manifest.build_id))
    monkeypatch.setattr(serve, "get_deployment_handle", lambda *a, **k: SimpleNamespace())
    monkeypatch.setattr(serve, "delete", lambda name, _blocking=True: gone.append(name))
    registry = getattr(ia, "IndexHolders", None)
    if registry is not None:
        local = registry()
        monkeypatch.setattr(ia, "holders_call", lambda method, *args: getattr(local, method)(*args))
    # what the counting of Retriever replicas saw (before the registry): this app's replica stopping,
    # another app's running
    apps = {"longrag": SimpleNamespace(status="RUNNING", deployments={"Retriever": SimpleNamespace(
                replica_states={"STOPPING": 1})}),
            "eval": SimpleNamespace(status="RUNNING", deployments={"Retriever": SimpleNamespace(
                replica_states={"RUNNING": 1})})}
    monkeypatch.setattr(status, "serve_status", lambda: SimpleNamespace(applications=apps))
    return gone


def config(retire_after_s: float = 0.3):
    return LongRAGConfig().with_overrides([f"index.retire_after_s={retire_after_s}"]).index


def test_a_rollback_within_retire_after_s_keeps_the_application(build, deleted):
    uri, app = build

    async def scenario() -> None:
        old = ia.ServeIndex(uri, config(), app_name="longrag", holder="replica-1")
        await old.retire()  # the alias moved to another build: this one retires in 0.3 s
        await asyncio.sleep(0.1)
        # rolled back within the window: the replica's refresh adopts the running application again
        again = ia.ServeIndex(uri, config(), app_name="longrag", holder="replica-1")
        assert again.app == app
        await asyncio.sleep(0.6)  # past the first retirement's deadline
        assert deleted == [], "the retirement's timer deleted the application of the live build"
        await again.release()
        assert deleted == [app]

    asyncio.run(scenario())


def test_a_retired_build_nobody_holds_is_deleted_after_the_window(build, deleted):
    uri, app = build

    async def scenario() -> None:
        old = ia.ServeIndex(uri, config(), app_name="longrag", holder="replica-1")
        await old.retire()
        await asyncio.sleep(0.1)
        assert deleted == []
        await asyncio.sleep(0.5)
        assert deleted == [app]
        await old.release()  # the replica goes away later: nothing more to delete
        assert deleted == [app]

    asyncio.run(scenario())


def test_two_holders_of_one_build_delete_its_application_only_after_the_last(build, deleted):
    uri, app = build

    async def scenario() -> None:
        service = ia.ServeIndex(uri, config(), app_name="longrag", holder="replica-1")
        evaluation = ia.ServeIndex(uri, config(), app_name="eval", holder="replica-1")
        await service.release()  # the service scales down to nothing; the evaluation still searches
        assert deleted == [], "the application was deleted while another holder still reads the build"
        await evaluation.release()
        assert deleted == [app]

    asyncio.run(scenario())


def test_the_registry_forgets_holders_whose_actor_died(monkeypatch):
    """A Retriever replica that died without releasing (its node lost) does not keep the application
    forever: the next release drops holders whose actor is dead."""
    gone: list[str] = []
    monkeypatch.setattr(serve, "delete", lambda name, _blocking=True: gone.append(name))
    monkeypatch.setattr(ia.ray_private, "actor_table",
                        lambda: [{"ActorID": "dead1", "State": "DEAD"}, {"ActorID": "live1", "State": "ALIVE"}])
    reg = ia.IndexHolders()
    reg.hold("index-b", "a#1", "dead1")
    reg.hold("index-b", "b#1", "live1")
    reg.hold("index-b", "job#1", None)
    assert reg.release("index-b", "job#1") is False and gone == []  # b#1's actor is alive
    assert reg.held() == {"index-b": ["b#1"]}
    assert reg.release("index-b", "b#1") is True and gone == ["index-b"]
    assert reg.release("index-b", "b#1") is False and gone == ["index-b"]  # released twice: once deleted


# the replica object's garbage collection calls its async __del__ again, unawaited (Serve awaits it once)
@pytest.mark.filterwarnings("ignore:coroutine 'Retriever.__del__' was never awaited")
def test_a_retriever_stopping_within_retire_after_s_releases_the_superseded_build(tmp_path, deleted, monkeypatch):
    """Issue 44 item 3.1: the alias moves, the Retriever replica switches and retires the old build's
    application (its hold to end ``retire_after_s`` later), then the replica stops before that: its
    graceful shutdown ends both holds, so neither application is left running with nobody using it."""
    from longrag.index.alias import publish
    from serve import deployments

    first = write_tiny_build(tmp_path / "alias" / "b1", DOCS, shards=1)
    second = write_tiny_build(tmp_path / "alias" / "b2", DOCS[::-1], shards=1)
    apps = [ia.index_app_name(ArtifactStore.open(u).read_manifest().build_id) for u in (first, second)]
    assert apps[0] != apps[1]
    alias = str(tmp_path / "alias")
    publish(alias, first)
    monkeypatch.setattr(deployments.serve, "get_replica_context",
                        lambda: SimpleNamespace(app_name="longrag", replica_id="r1"))

    async def scenario() -> None:
        retriever = deployments.Retriever.func_or_class(alias, config(retire_after_s=30), ia.ServeIndex)
        publish(alias, second)
        assert await retriever.refresh() == ArtifactStore.open(second).read_manifest().build_id
        assert deleted == []  # the old build retires for 30 s
        await retriever.__del__()  # the replica stops (scale-down, redeploy) well within those 30 s
        assert sorted(deleted) == sorted(apps), "the superseded build's application was leaked"

    asyncio.run(scenario())


def test_the_registry_prunes_dead_holders_of_every_application_on_every_call(monkeypatch):
    """Issue 44 item 3.1: a holder whose actor died is dropped at the registry's next call, whichever
    application that call is about, and an application nobody holds then is deleted: no later
    release of that same application is needed (there may never be one)."""
    gone: list[str] = []
    states = {"r1": "ALIVE", "r2": "ALIVE"}
    monkeypatch.setattr(serve, "delete", lambda name, _blocking=True: gone.append(name))
    monkeypatch.setattr(ia.ray_private, "actor_table",
                        lambda: [{"ActorID": a, "State": s} for a, s in states.items()])
    reg = ia.IndexHolders()
    reg.hold("index-old", "longrag/r1#1", "r1")  # a superseded build only the replica r1 still held
    reg.hold("index-new", "longrag/r2#1", "r2")
    states["r1"] = "DEAD"  # r1's node is lost within retire_after_s: it never releases index-old
    assert reg.held() == {"index-new": ["longrag/r2#1"]} and gone == ["index-old"]
    # the same on a hold and on a release of another application
    reg.hold("index-x", "longrag/r1b#1", "r1b")
    states["r1b"] = "DEAD"
    assert reg.hold("index-new", "job#1", None) == 2 and gone == ["index-old", "index-x"]
    reg.hold("index-y", "longrag/r1c#1", "r1c")
    states["r1c"] = "DEAD"
    assert reg.release("index-new", "job#1") is False and gone == ["index-old", "index-x", "index-y"]
    assert reg.held() == {"index-new": ["longrag/r2#1"]}
    # an application being held is not deleted by the pruning of that hold, though its holder died
    reg.hold("index-z", "longrag/r1d#1", "r1d")
    states["r1d"] = "DEAD"
    assert reg.hold("index-z", "longrag/r3#1", "r3") == 1 and "index-z" not in gone
