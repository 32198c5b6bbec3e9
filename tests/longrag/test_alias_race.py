"""Two publishers racing on one build alias (issue 40, item 2a): ``publish(..., expect_build_id=)`` is one
compare-and-swap of ``current.json`` on the store (``Storage.swap_bytes``: a lock on a local or shared
filesystem, a conditional PUT on S3), so in every round exactly one publisher wins and the other gets
:class:`longrag.index.alias.AliasConflict` naming the build it expected and the one it found. On the local
store and on the moto S3 server (tests/s3server.py); threads released together by a barrier, and on the
local store two processes publishing freely (no generation is ever published twice)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from longrag.index import alias as alias_mod
from longrag.index.alias import AliasError, BuildPointer, publish, read_pointer
from longrag.index.artifacts import ArtifactStore
from tests.fakes import write_tiny_build
from tests.s3server import moto_s3

ROUNDS = 30
DOCS = [("Angola", "Luanda is the capital of Angola."), ("Orwell", "George Orwell wrote Animal Farm.")]

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> list[tuple[str, str]]:
    """Three complete builds: ``(uri, build_id)``."""
    root = tmp_path_factory.mktemp("builds")
    out = []
    for name in "abc":
        uri = write_tiny_build(root / name, DOCS, shards=1)
        out.append((uri, ArtifactStore.open(uri).read_manifest().build_id))
    return out


@pytest.fixture(scope="module")
def moto_endpoint():
    with moto_s3("aliases") as endpoint:
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def alias_uri(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "alias")
    request.getfixturevalue("moto_endpoint")
    return f"s3://aliases/{tmp_path.name}"


@pytest.fixture
def slow_publisher(monkeypatch):
    """A publisher slow between reading the pointer and writing the new one (a GC pause, a slow
    network): 5 ms in building the new pointer's JSON, so both racers read the same old pointer."""
    dump = BuildPointer.model_dump_json

    def slow(self, **kw):
        time.sleep(0.005)
        return dump(self, **kw)

    monkeypatch.setattr(BuildPointer, "model_dump_json", slow)


def test_two_racing_publishers_exactly_one_wins_each_round(alias_uri, builds, slow_publisher):
    publish(alias_uri, builds[0][0])
    for r in range(ROUNDS):
        current = read_pointer(alias_uri)
        racers = [b for b in builds if b[1] != current.build_id][:2]
        barrier = threading.Barrier(2, timeout=30)
        outcome: list[BuildPointer | Exception | None] = [None, None]

        def run(i: int) -> None:
            barrier.wait()
            try:
                outcome[i] = publish(alias_uri, racers[i][0], expect_build_id=current.build_id)
            except AliasError as exc:
                outcome[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [o for o in outcome if isinstance(o, BuildPointer)]
        assert len(winners) == 1, f"round {r}: {len(winners)} publishers won from generation {current.generation}: " \
                                  f"{outcome}"
        won, lost = winners[0], next(o for o in outcome if not isinstance(o, BuildPointer))
        assert type(lost).__name__ == "AliasConflict", repr(lost)
        assert isinstance(lost, alias_mod.AliasConflict)
        assert (lost.expected, lost.found) == (current.build_id, won.build_id)
        assert current.build_id in str(lost) and won.build_id in str(lost)
        assert (won.generation, won.previous_build_id) == (current.generation + 1, current.build_id)
        assert read_pointer(alias_uri) == won
    assert read_pointer(alias_uri).generation == ROUNDS + 1


def test_a_publish_without_expectation_publishes_over_a_racing_one(alias_uri, builds, slow_publisher):
    """No ``expect_build_id``: the last one wins, but no generation is lost or published twice."""
    publish(alias_uri, builds[0][0])
    barrier = threading.Barrier(2, timeout=30)
    got: list[BuildPointer] = []

    def run(i: int) -> None:
        barrier.wait()
        got.append(publish(alias_uri, builds[1 + i][0]))

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(p.generation for p in got) == [2, 3]
    last = max(got, key=lambda p: p.generation)
    first = min(got, key=lambda p: p.generation)
    assert read_pointer(alias_uri) == last and last.previous_build_id == first.build_id


def _publish_loop(alias: str, builds: list[tuple[str, str]], rounds: int, start, queue) -> None:
    """One publisher process: ``rounds`` updates, each from the build it last read."""
    from longrag.index.alias import AliasError, publish, read_pointer

    start.wait(60)
    wins, conflicts = [], []
    for i in range(rounds):
        current = read_pointer(alias)
        uri = next(u for u, b in builds[i % 2:] + builds if b != current.build_id)
        try:
            p = publish(alias, uri, expect_build_id=current.build_id)
            wins.append((p.generation, p.previous_build_id))
        except AliasError as exc:
            conflicts.append(type(exc).__name__)
    queue.put((wins, conflicts))


def test_two_publisher_processes_never_publish_one_generation_twice(tmp_path, builds):
    """Two processes updating one local alias as fast as they can: every generation is published
    by exactly one of them (the lock is across processes, not only threads)."""
    alias = str(tmp_path / "alias")
    publish(alias, builds[0][0])
    ctx = multiprocessing.get_context("spawn")
    start, queue = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_publish_loop, args=(alias, builds, 150, start, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    time.sleep(3.0)  # both imported and waiting
    start.set()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    wins = [w for ws, _ in results for w in ws]
    generations = sorted(g for g, _ in wins)
    assert len(generations) == len(set(generations)), \
        f"{len(generations) - len(set(generations))} generations published twice (lost updates)"
    assert generations == list(range(2, 2 + len(wins)))
    assert read_pointer(alias).generation == 1 + len(wins)
    conflicts = [c for _, cs in results for c in cs]
    assert set(conflicts) <= {"AliasConflict"} and len(conflicts) + len(wins) == 300


def test_swap_bytes_writes_only_over_what_was_expected(alias_uri):
    from longrag.store import WriteConflict, open_storage

    storage = open_storage(alias_uri)
    storage.swap_bytes("k.json", b"1", expected=None)  # absent: created
    with pytest.raises(WriteConflict) as err:
        storage.swap_bytes("k.json", b"2", expected=None)  # it exists now
    assert err.value.found == b"1" and "k.json" in str(err.value)
    with pytest.raises(WriteConflict) as err:
        storage.swap_bytes("k.json", b"2", expected=b"0")
    assert err.value.found == b"1"
    storage.swap_bytes("k.json", b"2", expected=b"1")
    assert storage.read_bytes("k.json") == b"2" and storage.list() == ["k.json"]  # the lock file is hidden
