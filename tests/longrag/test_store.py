"""Artifact store: shard roundtrip, checksums, missing files, manifest, local and S3 (moto server)."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from longrag.config import LongRAGConfig
from longrag.index.artifacts import (
    ArtifactStore,
    IncompleteBuildError,
    load_shard,
    load_shard_chunks,
    verify_shard,
    write_shard,
)
from longrag.index.manifest import Manifest, ShardEntry, git_commit, shard_plan
from longrag.index.maxp import MaxPIndex, merge_topk
from longrag.records import units_to_parquet
from longrag.store import ChecksumError, LocalStorage, open_storage, source_location
from longrag.types import Chunk, Unit
from tests.s3server import moto_s3

DIM = 8
faiss.omp_set_num_threads(1)


def make_corpus(seed: int = 0, n_units: int = 12):
    rng = np.random.default_rng(seed)
    units, chunks = [], []
    for u in range(n_units):
        uid = f"unit-{u:03d}"
        n_chunks = int(rng.integers(1, 4))
        parts = [f"text of {uid} part {p} é ✓" for p in range(n_chunks)]
        units.append(Unit(uid, [f"d{u}a", f"d{u}b"], [f"Title {u}", f"Other {u}"], " ".join(parts), 7 * n_chunks))
        chunks += [Chunk(f"{uid}#{p}", uid, p, parts[p], 7) for p in range(n_chunks)]
    vectors = rng.standard_normal((len(chunks), DIM)).astype(np.float32)
    return units, chunks, vectors


def build_store(store: ArtifactStore, n_shards: int = 2, complete: bool = True):
    units, chunks, vectors = make_corpus()
    cfg = LongRAGConfig()
    manifest = Manifest.create(cfg, dim=DIM, max_seq_length=256, documents=2 * len(units), argv=["jobs.index", "--x"])
    store.write_manifest(manifest)
    for s in range(n_shards):
        shard_units = [u for i, u in enumerate(units) if i % n_shards == s]
        ids = {u.unit_id for u in shard_units}
        rows = [i for i, c in enumerate(chunks) if c.unit_id in ids]
        shard_chunks = [chunks[i] for i in rows]
        index = MaxPIndex.build(vectors[rows], [c.chunk_id for c in shard_chunks], [c.unit_id for c in shard_chunks])
        manifest.add_shard(write_shard(store, s, shard_units, shard_chunks, index))
    if complete:
        manifest.mark_complete()
    store.write_manifest(manifest)
    return units, chunks, vectors, manifest


@pytest.fixture(scope="module")
def moto_endpoint():
    with moto_s3("longrag-test") as endpoint:
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return ArtifactStore.open(tmp_path / "build")
    endpoint = request.getfixturevalue("moto_endpoint")
    return ArtifactStore.open(f"s3://longrag-test/builds/{tmp_path.name}", endpoint_url=endpoint)


def test_roundtrip(store: ArtifactStore) -> None:
    units, chunks, vectors, manifest = build_store(store)
    assert store.status() == "complete"
    keys = store.storage.list()
    assert "manifest.json" in keys and "config.yaml" not in keys  # the config lives in the manifest
    for name in ("units.parquet", "chunks.parquet", "index.faiss", "chunk_units.npy", "shard.json"):
        assert f"shards/shard-00000/{name}" in keys and f"shards/shard-00001/{name}" in keys
    assert store.read_manifest().config == LongRAGConfig().model_dump(mode="json")

    by_id = {u.unit_id: u for u in units}
    queries = np.random.default_rng(9).standard_normal((3, DIM)).astype(np.float32)
    full = MaxPIndex.build(vectors, [c.chunk_id for c in chunks], [c.unit_id for c in chunks])
    shard_hits = []
    n_loaded = 0
    for s in manifest.shard_ids:
        index, shard_units = load_shard(store, s)
        n_loaded += len(shard_units)
        for uid in shard_units:
            assert shard_units[uid] == by_id[uid]  # Unit dataclass equality: every field survived
        assert shard_units.get("nope") is None and "nope" not in shard_units
        some = shard_units.ids()[::-1][:3]
        assert shard_units.get_many(some) == [by_id[u] for u in some]
        with pytest.raises(KeyError):
            shard_units["nope"]
        shard_hits.append(index.search(queries, 5))
        shard_chunks = load_shard_chunks(store, s)
        for cid in shard_chunks:
            assert shard_chunks[cid] == next(c for c in chunks if c.chunk_id == cid)
    assert n_loaded == len(units)
    expected = full.search(queries, 5)
    for q in range(len(queries)):
        assert merge_topk([h[q] for h in shard_hits], 5) == expected[q]


def test_manifest_fields(tmp_path) -> None:
    store = ArtifactStore.open(tmp_path)
    units, chunks, _, _ = build_store(store)
    raw = json.loads(store.storage.read_bytes("manifest.json"))
    m = store.read_manifest()
    assert raw["status"] == m.status == "complete"
    assert m.embedding.model == "all-MiniLM-L6-v2" and m.embedding.dim == DIM and m.embedding.max_seq_length == 256
    assert (m.metric, m.factory, m.unit_kind) == ("ip", "Flat", "grouped")
    assert (m.counts.documents, m.counts.units, m.counts.chunks) == (2 * len(units), len(units), len(chunks))
    assert [s.shard_id for s in m.shards] == [0, 1]
    assert sum(s.n_units for s in m.shards) == len(units)
    for entry in m.shards:
        assert set(entry.files) >= {"units.parquet", "chunks.parquet", "index.faiss", "chunk_units.npy"}
        for name, f in entry.files.items():
            data = store.storage.read_bytes(f"shards/shard-{entry.shard_id:05d}/{name}")
            assert f.bytes == len(data) and len(f.sha256) == 64
    assert m.config == LongRAGConfig().model_dump()
    p = m.provenance
    assert p.hostname and p.python and p.command == ["jobs.index", "--x"]
    assert p.versions["faiss"] and p.versions["numpy"] and p.versions["longrag"]
    assert p.git_commit == git_commit()
    assert Manifest.from_json(m.to_json()) == m
    assert len(m.build_id) > 10 and m.created_at.endswith("+00:00")


def test_git_commit_is_git_rev_parse_or_none(tmp_path) -> None:
    import shutil
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    assert git_commit(repo) is None  # not a repository
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert git_commit(repo) is None  # before the first commit
    (repo / "f").write_text("x")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    head = subprocess.run([*git, "log", "-1", "--format=%H"], capture_output=True, text=True, check=True).stdout.strip()
    assert len(head) == 40 and git_commit(repo / ".") == head
    assert shutil.which("git")


def test_checksum_failure(store: ArtifactStore) -> None:
    build_store(store)
    key = "shards/shard-00001/units.parquet"
    data = bytearray(store.storage.read_bytes(key))
    data[len(data) // 2] ^= 0xFF
    store.storage.write_bytes(key, bytes(data))
    expected = store.read_manifest().shard(1).files["units.parquet"].sha256
    with pytest.raises(ChecksumError) as info:
        load_shard(store, 1)
    err = info.value
    assert err.name == key and err.expected == expected and err.actual != expected
    assert key in str(err) and expected in str(err) and err.actual in str(err)
    with pytest.raises(ChecksumError):
        verify_shard(store, 1)
    load_shard(store, 0)  # the other shard is fine
    assert verify_shard(store, 0).shard_id == 0


def test_missing_file(store: ArtifactStore) -> None:
    build_store(store)
    store.storage.delete("shards/shard-00000/index.faiss")
    with pytest.raises(FileNotFoundError, match="shards/shard-00000/index.faiss"):
        load_shard(store, 0)
    with pytest.raises(KeyError, match="no shard 7"):
        load_shard(store, 7)


def test_incomplete_build_is_detected(tmp_path) -> None:
    store = ArtifactStore.open(tmp_path / "b")
    assert store.status() == "absent"
    with pytest.raises(IncompleteBuildError):
        load_shard(store, 0)
    build_store(store, n_shards=3, complete=False)
    assert store.status() == "building"
    with pytest.raises(IncompleteBuildError, match="building"):
        load_shard(store, 0)
    # A shard interrupted mid-write has no marker: resume skips the others and redoes it.
    store.storage.delete("shards/shard-00002/shard.json")
    done = store.completed_shards()
    assert sorted(done) == [0, 1] and all(isinstance(e, ShardEntry) for e in done.values())
    index, units = load_shard(store, 1, require_complete=False)
    assert index.ntotal == done[1].n_chunks and len(units) == done[1].n_units
    m = store.read_manifest()
    m.shards = [e for e in m.shards if e.shard_id in done]  # as a job would rebuild it on resume
    store.write_manifest(m)
    with pytest.raises(FileNotFoundError, match="not completely written"):
        load_shard(store, 2, require_complete=False)
    with pytest.raises(ValueError, match="no shards"):
        Manifest.create(LongRAGConfig(), dim=DIM).mark_complete()


def test_write_shard_checks(tmp_path) -> None:
    store = ArtifactStore.open(tmp_path)
    units, chunks, vectors = make_corpus(n_units=3)
    index = MaxPIndex.build(vectors, [c.chunk_id for c in chunks], [c.unit_id for c in chunks])
    with pytest.raises(ValueError, match="not in units"):
        write_shard(store, 0, units[:2], chunks, index)
    with pytest.raises(ValueError, match="vectors for"):
        write_shard(store, 0, units, chunks[:-1], index)
    wrong = [Chunk(c.chunk_id, units[0].unit_id, c.position, c.text, c.n_tokens) for c in chunks]
    with pytest.raises(ValueError, match="indexed under unit"):
        write_shard(store, 0, units, wrong, index)
    with pytest.raises(ValueError, match="duplicate unit"):
        write_shard(store, 0, units + units[:1], chunks, index)
    assert store.completed_shards() == {}


def test_storage_keys_and_uris(tmp_path) -> None:
    s = LocalStorage(tmp_path)
    for bad in ("", "/abs", "a/../b", "a//b"):
        with pytest.raises(ValueError, match="invalid storage key"):
            s.write_bytes(bad, b"x")
    s.write_bytes("a/b.txt", b"hello")
    assert s.exists("a/b.txt") and s.list() == ["a/b.txt"] and s.list("a/") == ["a/b.txt"]
    with pytest.raises(FileNotFoundError, match="nope"):
        s.read_bytes("nope")
    assert ArtifactStore.open(f"file://{tmp_path}").uri == str(tmp_path.resolve())
    with pytest.raises(ValueError, match="unsupported store URI"):
        ArtifactStore.open("ftp://host/x")
    # one interface over pyarrow's filesystems: GCS comes with it (opened, not reached: no network here)
    gcs = open_storage("gs://bucket/builds/b1")
    assert type(gcs.filesystem).__name__ == "GcsFileSystem" and gcs.path("manifest.json") == "bucket/builds/b1/manifest.json"
    assert source_location("gs://bucket/dumps/enwiki.xml.bz2")[1] == "enwiki.xml.bz2"
    # the same files for pyarrow readers: path + filesystem
    import pyarrow.parquet as pq

    s.write_bytes("p/t.parquet", units_to_parquet([Unit("u1", ["d1"], ["T"], "text", 1)]))
    assert pq.read_table(s.path("p/t.parquet"), filesystem=s.filesystem).column("unit_id").to_pylist() == ["u1"]
    s.write_bytes("p/.hidden", b"x")  # dot files (a local write's temp files) are not keys
    assert s.list("p/") == ["p/t.parquet"] and s.list("p/t") == ["p/t.parquet"] and s.list("q/") == []


def test_shard_plan_changes_with_any_unit_field_and_order():
    a = Unit(unit_id="u1", doc_ids=["d1"], titles=["A"], text="alpha", n_tokens=1)
    b = Unit(unit_id="u2", doc_ids=["d2", "d3"], titles=["B", "C"], text="beta gamma", n_tokens=2)
    base = shard_plan({0: [a, b], 1: []})
    assert set(base) == {"0", "1"} and base == shard_plan({0: [a, b], 1: []})
    assert base["1"] != base["0"]
    assert shard_plan({0: [b, a], 1: []})["0"] != base["0"]  # order is part of the plan
    for changed in (
        Unit(unit_id="u1", doc_ids=["d1"], titles=["A"], text="alphA", n_tokens=1),
        Unit(unit_id="u1", doc_ids=["d9"], titles=["A"], text="alpha", n_tokens=1),
        Unit(unit_id="u1", doc_ids=["d1"], titles=["Z"], text="alpha", n_tokens=1),
        Unit(unit_id="u1", doc_ids=["d1"], titles=["A"], text="alpha", n_tokens=2),
    ):
        assert shard_plan({0: [changed, b], 1: []})["0"] != base["0"]
    # field boundaries are unambiguous: moving text between units changes the digest
    c1 = Unit(unit_id="u1", doc_ids=["d1"], titles=["A"], text="ab", n_tokens=1)
    c2 = Unit(unit_id="u2", doc_ids=["d2"], titles=["B"], text="c", n_tokens=1)
    d1 = Unit(unit_id="u1", doc_ids=["d1"], titles=["A"], text="a", n_tokens=1)
    d2 = Unit(unit_id="u2", doc_ids=["d2"], titles=["B"], text="bc", n_tokens=1)
    assert shard_plan({0: [c1, c2]}) != shard_plan({0: [d1, d2]})


def test_storage_keeps_bytes_as_written_and_streams_them(store: ArtifactStore, tmp_path) -> None:
    """Local and S3 alike: a key named like a compressed file keeps its bytes (pyarrow would guess a
    codec from the extension), streams and ranged reads give them back, uploads and downloads round
    trip, listings hold files only and deletes are idempotent (S3 leaves directory markers behind)."""
    s = store.storage
    s.write_bytes("raw/a.gz", b"not gzip at all")
    s.write_bytes("raw/sub/b.bz2", b"nor bzip2")
    assert s.read_bytes("raw/a.gz") == b"not gzip at all"
    with s.open_read("raw/sub/b.bz2") as fh:
        assert fh.read() == b"nor bzip2"
    with s.open_read("raw/a.gz", seekable=True) as fh:
        fh.seek(4)
        assert fh.read(4) == b"gzip"
    src = tmp_path / "big.bin"
    src.write_bytes(bytes(range(256)) * 4096)
    s.upload_file(src, "raw/big.bin")
    s.download_file("raw/big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    assert s.list("raw/") == ["raw/a.gz", "raw/big.bin", "raw/sub/b.bz2"]
    s.delete("raw/sub/b.bz2")
    s.delete("raw/sub/b.bz2")
    assert s.list("raw/") == ["raw/a.gz", "raw/big.bin"] and not s.exists("raw/sub/b.bz2")
    for missing in (lambda: s.read_bytes("raw/nope"), lambda: s.open_read("raw/nope"),
                    lambda: s.open_read("raw/nope", seekable=True), lambda: s.download_file("raw/nope", tmp_path / "x")):
        with pytest.raises(FileNotFoundError, match="raw/nope"):
            missing()
