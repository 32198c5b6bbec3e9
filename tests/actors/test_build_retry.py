"""A retried staging task cannot corrupt a build (issue 40, item 5).

Ray retries a Ray Data task whose worker died (``max_retries=-1``) and reconstructs a lost block by
running its task again: the embedded chunks it stages (:func:`actors.build.stage_chunks`) are then
written twice. Their parts are named by the chunk ids they hold, so the second write replaces the
first instead of adding a part with the same chunks, which ``MaxPIndex.build`` would refuse
(duplicate chunk ids).

* without Ray: the same batch staged twice leaves one part per shard, and the shard builds;
* with Ray: a worker setup hook (``worker_process_setup_hook``, this module's
  :func:`die_once_after_staging_chunks`) makes the first worker that stages a part of embedded chunks
  die (``os._exit``) right after the write, once the test arms it; Ray runs the task again and the
  build completes, equal to a clean build of the same documents on the same Ray.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import ray

from actors.build import build_from_documents, build_from_staging, stage_chunks
from cluster.local import WORKER_ENV
from longrag.config import load_config
from longrag.index.artifacts import ArtifactStore, load_shard
from longrag.index.distplan import stage_shard_units, staged_chunks_prefix
from longrag.types import Document, Unit

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
FAULT_DIR_ENV = "LONGRAG_TEST_BUILD_FAULT_DIR"  # armed: <dir>/armed exists; fired: <dir>/fired written once


def die_once_after_staging_chunks() -> None:
    """Ray worker setup hook (test only): once ``$LONGRAG_TEST_BUILD_FAULT_DIR/armed`` exists, the
    first process that writes a part of embedded chunks to staging dies right after the write, as a
    worker lost after its task's side effect and before its result; every later write goes through."""
    folder = os.environ.get(FAULT_DIR_ENV)
    if not folder:
        return
    from longrag.store import Storage

    write = Storage.write_bytes

    def write_then_die_once(self, key: str, data: bytes) -> None:
        write(self, key, data)
        if "staging/chunks/" not in key or not os.path.exists(os.path.join(folder, "armed")):
            return
        try:
            fd = os.open(os.path.join(folder, "fired"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, f"{os.getpid()} {key}\n".encode())
        os.close(fd)
        os._exit(1)

    Storage.write_bytes = write_then_die_once


# ------------------------------------------------------------------ without Ray

def _batch(n_units: int = 6, dim: int = 8) -> dict[str, np.ndarray]:
    """Embedded chunks of ``n_units`` units (2 chunks each) over 2 shards, as Ray Data hands them
    to :func:`stage_chunks` (numpy batch format)."""
    rng = np.random.default_rng(0)
    rows = [(f"u{u}", p) for u in range(n_units) for p in range(2)]
    vectors = rng.standard_normal((len(rows), dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return {
        "chunk_id": np.array([f"{u}:{p:04d}" for u, p in rows], dtype=object),
        "unit_id": np.array([u for u, _ in rows], dtype=object),
        "position": np.array([p for _, p in rows], dtype=np.int64),
        "text": np.array([f"chunk {p} of {u}" for u, p in rows], dtype=object),
        "n_tokens": np.array([4] * len(rows), dtype=np.int64),
        "shard": np.array([int(u[1:]) % 2 for u, _ in rows], dtype=np.int64),
        "vector": vectors,
    }


def test_the_same_batch_staged_twice_leaves_one_part_per_shard_and_the_shard_builds(tmp_path):
    batch = _batch()
    first = stage_chunks(batch, str(tmp_path))
    again = stage_chunks(batch, str(tmp_path))  # a retried task: the same block, the same chunks
    text = {s: sum(len(t.encode()) for t, sh in zip(batch["text"], batch["shard"]) if sh == s) for s in (0, 1)}
    assert first == again == {"shard": [0, 1], "n_chunks": [6, 6], "text_bytes": [text[0], text[1]], "dim": [8, 8]}
    store = ArtifactStore.open(str(tmp_path))
    for shard in (0, 1):
        parts = store.storage.list(staged_chunks_prefix(shard))
        assert len(parts) == 1, f"shard {shard}: {parts}: the retry added a part instead of replacing it"
        units = [Unit(unit_id=f"u{u}", doc_ids=[str(u)], titles=[f"T{u}"], text=f"unit {u}", n_tokens=8)
                 for u in range(6) if u % 2 == shard]
        stage_shard_units(store.storage, shard, units)
        entry = build_from_staging(str(tmp_path), shard, "Flat", "ip")
        assert '"n_chunks":6' in entry.replace(" ", ""), entry


def test_parts_are_named_by_the_chunks_they_hold(tmp_path):
    """Two different batches of one shard are two parts (nothing is lost by the content naming)."""
    batch = _batch()
    stage_chunks({k: v[:6] for k, v in batch.items()}, str(tmp_path))
    stage_chunks({k: v[6:] for k, v in batch.items()}, str(tmp_path))
    parts = ArtifactStore.open(str(tmp_path)).storage.list(staged_chunks_prefix(0))
    assert len(parts) == 2, parts


# ------------------------------------------------------------------ with Ray

DOCS = [Document(doc_id=str(i), title=title, text=text) for i, (title, text) in enumerate([
    ("Animal Farm", "Animal Farm is a novel by George Orwell. It was published in 1945. " * 3),
    ("George Orwell", "George Orwell was an English writer. He wrote Animal Farm and Nineteen Eighty-Four. " * 3),
    ("Luanda", "Luanda is the capital of Angola. It lies on the Atlantic coast of Africa. " * 3),
    ("Angola", "Angola is a country in Southern Africa. Its capital is Luanda. " * 3),
    ("Apollo 11", "Apollo 11 was the first spaceflight to land humans on the Moon in 1969. " * 3),
    ("Moon", "The Moon is Earth's only natural satellite. Apollo 11 landed there. " * 3),
    ("Aruba", "Aruba is a country within the Kingdom of the Netherlands, in the Caribbean. " * 3),
    ("George Gershwin", "George Gershwin composed An American in Paris and Rhapsody in Blue. " * 3),
    ("Rhapsody in Blue", "Rhapsody in Blue is a 1924 composition by George Gershwin for piano and band. " * 3),
    ("Danube", "The Danube is the second-longest river in Europe, flowing through Vienna and Budapest. " * 3),
    ("Vienna", "Vienna is the capital of Austria and lies on the Danube. " * 3),
    ("Budapest", "Budapest is the capital of Hungary, divided by the Danube. " * 3),
])]


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """One local Ray for the module (2 logical CPUs, as ``make demo`` builds) whose workers run the
    fault hook; yields the hook's folder (create ``armed`` in it to arm the fault)."""
    folder = tmp_path_factory.mktemp("build-fault")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="longrag",
             object_store_memory=512 * 1024**2, log_to_driver=False,
             runtime_env={"env_vars": {**WORKER_ENV, "PYTHONPATH": path, FAULT_DIR_ENV: str(folder)},
                          "worker_process_setup_hook": f"{__name__}.die_once_after_staging_chunks"})
    try:
        yield folder
    finally:
        ray.shutdown()


def _shards(out: Path) -> dict[int, dict]:
    store = ArtifactStore.open(str(out))
    manifest = store.read_manifest()
    shards = {}
    for entry in manifest.shards:
        index, units = load_shard(store, entry.shard_id)
        shards[entry.shard_id] = {
            "n_units": entry.n_units, "n_chunks": entry.n_chunks,
            "files": {name: f.sha256 for name, f in entry.files.items()},
            "chunk_ids": [str(c) for c in index.chunk_ids], "unit_ids": sorted(units.ids()),
            "vectors": index.index.reconstruct_n(0, index.ntotal),
        }
    return shards


def test_a_staging_worker_killed_after_its_write_still_gives_the_clean_build(faults, tmp_path):
    config = load_config(None, ["index.shards=2", "units.kind=document"])
    clean = build_from_documents(DOCS, str(tmp_path / "clean"), config)
    assert clean["counts"]["units"] == len(DOCS) and clean["counts"]["shards"] == 2, clean["counts"]
    (faults / "armed").touch()
    faulty = build_from_documents(DOCS, str(tmp_path / "faulty"), config)  # before the fix: duplicate chunk ids
    assert faulty["counts"] == clean["counts"], (faulty["counts"], clean["counts"])
    assert (faults / "fired").exists(), "the fault never fired: no worker died after staging chunks"
    assert "staging/chunks/" in (faults / "fired").read_text()
    want, got = _shards(tmp_path / "clean"), _shards(tmp_path / "faulty")
    assert sorted(got) == sorted(want) == [0, 1]
    for s in want:
        assert got[s]["chunk_ids"] == want[s]["chunk_ids"], f"shard {s}: other chunks than the clean build"
        assert got[s]["unit_ids"] == want[s]["unit_ids"]
        assert (got[s]["n_units"], got[s]["n_chunks"]) == (want[s]["n_units"], want[s]["n_chunks"])
        np.testing.assert_allclose(got[s]["vectors"], want[s]["vectors"], atol=1e-5)
        same = {k for k in want[s]["files"] if got[s]["files"].get(k) == want[s]["files"][k]}
        assert same >= set(want[s]["files"]) - {"index.faiss"}, (s, got[s]["files"], want[s]["files"])
