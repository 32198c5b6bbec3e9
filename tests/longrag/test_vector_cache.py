"""The on-disk vector cache (embedding.vector_cache): a second encode of the same texts is served without
calling the model and returns the same vectors; another setting misses; a damaged file or row is a miss and is
written again."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

torch.set_num_threads(1)

from longrag.config import EmbeddingConfig  # noqa: E402
from longrag.index.embedding import Embedder, ModelSpec  # noqa: E402
from longrag.index.vector_cache import VectorCache, cache_settings, model_identity  # noqa: E402

TEXTS = ["Luanda is the capital of Angola.", "Apollo 11 landed on the Moon in 1969.", "Aruba is an island.",
         "Luanda is the capital of Angola."]


class Counted:
    """Wraps the sentence-transformers model: counts ``encode`` calls and the texts they got."""

    def __init__(self, model) -> None:
        self.model, self.calls, self.texts = model, 0, 0

    def encode(self, texts, **kwargs):
        self.calls += 1
        self.texts += len(texts)
        return self.model.encode(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def cached_embedder(folder, **fields) -> tuple[Embedder, Counted]:
    embedder = Embedder(EmbeddingConfig(device="cpu", vector_cache=True, vector_cache_dir=str(folder), **fields))
    embedder.model = Counted(embedder.model)
    return embedder, embedder.model


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return Embedder(EmbeddingConfig(device="cpu")).encode_passages(TEXTS)


def test_second_encode_hits_without_calling_the_model(tmp_path, reference) -> None:
    embedder, model = cached_embedder(tmp_path)
    first = embedder.encode_passages(TEXTS)
    assert (model.calls, model.texts) == (1, 3)  # the repeated text encoded once
    np.testing.assert_array_equal(first, reference)
    again, other = cached_embedder(tmp_path)  # a new process' Embedder: only the file is shared
    second = again.encode_passages(TEXTS[::-1])
    assert other.calls == 0 and (again.cache.hits, again.cache.misses) == (4, 0)
    np.testing.assert_array_equal(second, reference[::-1])
    mixed = again.encode_passages(["Aruba is an island.", "A text never seen."])
    assert (other.calls, other.texts) == (1, 1)
    np.testing.assert_array_equal(mixed[0], reference[2])
    assert again.encode_queries(["Where is Luanda?"]).shape == (1, 384) and other.calls == 2  # queries: never cached


def test_another_setting_misses(tmp_path) -> None:
    embedder, model = cached_embedder(tmp_path)
    embedder.encode_passages(TEXTS)
    for fields in ({"document_instruction": "passage: "}, {"max_seq_length": 128}, {"quantize": "int8"},
                   {"normalize": False}):
        other, counted = cached_embedder(tmp_path, **fields)
        assert other.cache.path != embedder.cache.path
        other.encode_passages(TEXTS)
        assert counted.calls == 1, fields
    assert len(list(tmp_path.glob("*.sqlite"))) == 5


def test_matryoshka_dim_and_model_identity_are_in_the_key(tmp_path) -> None:
    settings = {"schema": 1, "model": {"name": "m"}, "dim": 768, "normalize": True}
    paths = {VectorCache(tmp_path, {**settings, "dim": d}).path for d in (768, 512, 256)}
    assert len(paths) == 3
    gemma = model_identity(ModelSpec("embeddinggemma-300m", "/nowhere", 768, 2048, None))
    from longrag.models.fetched import FETCHED_MODELS

    assert gemma == {"name": "embeddinggemma-300m",
                     "manifest_sha256": FETCHED_MODELS["embeddinggemma-300m"].manifest_sha256}
    embedder = Embedder(EmbeddingConfig(device="cpu"))
    minilm = cache_settings(embedder)["model"]
    assert "config.json" in minilm["configs"] and minilm["weights_bytes"]["model.safetensors"] > 80_000_000


def test_a_corrupted_file_is_a_miss_and_is_written_again(tmp_path, reference) -> None:
    embedder, model = cached_embedder(tmp_path)
    embedder.encode_passages(TEXTS)
    embedder.cache.path.write_bytes(b"not a database" * 100)
    vectors = embedder.encode_passages(TEXTS)
    assert model.calls == 2
    np.testing.assert_array_equal(vectors, reference)
    fresh, counted = cached_embedder(tmp_path)
    np.testing.assert_array_equal(fresh.encode_passages(TEXTS), reference)
    assert counted.calls == 0  # rewritten: the next run hits


def test_a_damaged_row_is_a_miss_and_is_written_again(tmp_path, reference) -> None:
    import sqlite3

    embedder, model = cached_embedder(tmp_path)
    embedder.encode_passages(TEXTS)
    with sqlite3.connect(embedder.cache.path) as con:
        con.execute("UPDATE vectors SET vec = ? WHERE rowid = 1", (np.ones(384, np.float32).tobytes(),))
        con.execute("UPDATE vectors SET vec = ? WHERE rowid = 2", (b"short",))
    vectors = embedder.encode_passages(TEXTS)
    assert (model.calls, model.texts) == (2, 5)
    np.testing.assert_array_equal(vectors, reference)
    embedder.encode_passages(TEXTS)
    assert model.calls == 2


def test_a_file_locked_by_another_process_is_a_miss_and_is_kept(tmp_path, reference) -> None:
    """Several embedding actors of one build share the file: one that finds it locked past the timeout
    encodes its texts itself and leaves the file, and what the other process commits, in place."""
    import hashlib
    import sqlite3

    from longrag.index.vector_cache import text_key

    embedder, model = cached_embedder(tmp_path)
    embedder.encode_passages(TEXTS[:1])
    embedder.cache.lock_timeout_s = 0.05
    other = sqlite3.connect(embedder.cache.path)
    other.execute("BEGIN EXCLUSIVE")  # another actor in the middle of a write
    vec = reference[1].astype(np.float32).tobytes()
    other.execute("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)",
                  (text_key("Another actor's text."), vec, hashlib.sha256(vec).hexdigest()))
    try:
        vectors = embedder.encode_passages(TEXTS)
        np.testing.assert_array_equal(vectors, reference)
        assert model.calls == 2 and model.texts == 1 + 3  # nothing read from the locked file
    finally:
        other.commit()
        other.close()
    fresh, counted = cached_embedder(tmp_path)
    got = fresh.encode_passages(["Another actor's text.", TEXTS[0]])
    assert counted.calls == 0  # the other actor's commit and the row from before both in the file
    np.testing.assert_array_equal(got[0], reference[1])
