"""The node-local shard file cache (issue 40, item 6): a remote store's file is fetched and hashed once per
content, a local one hashed once while unchanged; a mismatch is refused and leaves nothing under a final
name; a shard loaded through the cache answers exactly as one loaded from bytes, its FAISS index mapped
from the cached file. The remote store is the moto S3 server (tests/s3server.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from longrag.index.artifacts import ArtifactStore, load_shard, load_shard_chunks
from longrag.index.shard_cache import ShardFileCache
from longrag.store import ChecksumError, open_storage
from tests.fakes import HashEncoder, write_tiny_build

DOCS = [(f"Title {i}", f"Document {i} is about topic {i % 5}. Item {i * 7} appears here.") for i in range(30)]


def test_a_local_file_is_hashed_once_while_unchanged(tmp_path):
    store_dir = tmp_path / "store"
    data = b"vectors" * 1000
    (store_dir / "shards").mkdir(parents=True)
    (store_dir / "shards" / "f.bin").write_bytes(data)
    storage = open_storage(str(store_dir))
    sha = hashlib.sha256(data).hexdigest()
    cache = ShardFileCache(tmp_path / "cache")
    for _ in range(3):
        assert cache.path(storage, "shards/f.bin", sha, len(data)) == store_dir / "shards" / "f.bin"
    assert (cache.hashed, cache.hits) == (1, 2)
    os.utime(store_dir / "shards" / "f.bin", ns=(1, 1))  # touched: hashed again
    cache.path(storage, "shards/f.bin", sha, len(data))
    assert cache.hashed == 2
    (store_dir / "shards" / "f.bin").write_bytes(data[:-1] + b"X")  # changed: refused
    with pytest.raises(ChecksumError):
        cache.path(storage, "shards/f.bin", sha, len(data))


def test_a_shard_through_the_cache_answers_as_one_read_from_bytes(tmp_path):
    uri = write_tiny_build(tmp_path / "b", DOCS, shards=2)
    store = ArtifactStore.open(uri)
    cache = ShardFileCache(tmp_path / "cache")
    queries = HashEncoder().encode_queries(["topic 3 item 21", "document 12"])
    for shard in (0, 1):
        plain, plain_units = load_shard(store, shard)
        mapped, mapped_units = load_shard(store, shard, cache=cache)
        a, b = plain.search(queries, 5), mapped.search(queries, 5)
        assert [[(h.unit_id, h.best_chunk_id) for h in q] for q in a] == \
            [[(h.unit_id, h.best_chunk_id) for h in q] for q in b]
        np.testing.assert_allclose([[h.score for h in q] for q in a], [[h.score for h in q] for q in b], rtol=1e-6)
        assert plain_units.ids() == mapped_units.ids() and len(plain_units) > 0
        assert len(load_shard_chunks(store, shard, cache=cache)) == plain.ntotal


def _upload(local: str, uri: str) -> None:
    src, dst = open_storage(local), open_storage(uri)
    for key in src.list(""):
        dst.write_bytes(key, src.read_bytes(key))


def test_a_remote_file_is_fetched_once_and_a_bad_one_never_gets_a_final_name(tmp_path):
    from tests.s3server import moto_s3

    local = write_tiny_build(tmp_path / "b", DOCS, shards=1)
    with moto_s3("builds"):
        _upload(local, "s3://builds/b")
        store = ArtifactStore.open("s3://builds/b")
        _remote_checks(store, tmp_path)


def _remote_checks(store, tmp_path: Path) -> None:
    cache = ShardFileCache(tmp_path / "cache")
    first, _ = load_shard(store, 0, cache=cache)
    fetched = cache.fetched
    assert fetched >= 2 and cache.hits == 0
    again, _ = load_shard(store, 0, cache=cache)
    assert cache.fetched == fetched and cache.hits == fetched  # nothing downloaded twice
    assert again.ntotal == first.ntotal
    files = sorted(p.name for p in (tmp_path / "cache" / "files").iterdir())
    assert all(len(name) == 64 for name in files)
    entry = store.read_manifest().shard(0)
    name, spec = next(iter(entry.files.items()))
    with pytest.raises(ChecksumError):
        ShardFileCache(tmp_path / "other").path(store.storage, store.shard_key(0, name), "0" * 64, spec.bytes)
    assert not (tmp_path / "other" / "files" / ("0" * 64)).exists()
    assert not [p for p in (tmp_path / "other" / "files").iterdir() if not p.name.startswith(".")]
