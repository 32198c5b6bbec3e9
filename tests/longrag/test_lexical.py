"""BM25 on a shard (longrag.index.lexical), MaxP over any per-chunk score, and reciprocal-rank fusion
(longrag.index.fusion), each against a reference written here from the formulas, not from the code."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from longrag.config import LongRAGConfig
from longrag.index.artifacts import ArtifactStore, load_shard_lexical, write_shard
from longrag.index.fusion import Fusion, fuse, merge_shards, rrf_scores
from longrag.index.lexical import LexicalIndex, LexicalIndexMissing, require_lexical
from longrag.index.manifest import Manifest
from longrag.index.maxp import MaxPIndex, merge_topk
from longrag.types import Chunk, InvalidRequest, Unit, UnitHit

STOP = {"the", "a", "an", "of", "and", "in", "on", "is", "are", "to"}  # the stop words these texts use
TEXTS = [
    "The cat sat on the mat",
    "Dogs are loyal animals and dogs guard houses",
    "A cat and a dog share the house",
    "Paris is the capital of France",
    "The capital of Italy is Rome and Rome has cats",
]


def lucene_bm25(texts: list[str], query: str, k1: float = 1.5, b: float = 0.75) -> list[float]:
    """Lucene's BM25 (Kamphuis et al., 2020): idf = ln(1 + (N - df + 0.5) / (df + 0.5)),
    tf part = tf / (tf + k1 (1 - b + b dl / avgdl)); words of two or more letters, lower case."""
    docs = [[w for w in re.findall(r"\b\w\w+\b", t.lower()) if w not in STOP] for t in texts]
    n, avgdl = len(docs), sum(map(len, docs)) / len(docs)
    words = [w for w in re.findall(r"\b\w\w+\b", query.lower()) if w not in STOP]
    out = []
    for d in docs:
        s = 0.0
        for w in set(words):
            df = sum(w in doc for doc in docs)
            tf = d.count(w)
            if tf:
                s += math.log(1 + (n - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
        out.append(s)
    return out


@pytest.mark.parametrize("query", ["cat", "capital Rome", "dogs house cat", "Paris France capital"])
def test_bm25_scores_are_lucenes_and_survive_a_round_trip(query):
    index = LexicalIndex.build(TEXTS)
    want = lucene_bm25(TEXTS, query)
    np.testing.assert_allclose(index.scores(query), want, rtol=1e-5, atol=1e-6)
    again = LexicalIndex.from_files(index.to_files())
    np.testing.assert_allclose(again.scores(query), want, rtol=1e-5, atol=1e-6)


def test_a_query_without_indexed_words_scores_nothing():
    index = LexicalIndex.build(TEXTS)
    assert not index.scores("the of and").any()  # stop words only
    assert not index.scores("zebra").any()  # unknown word
    empty = LexicalIndex.from_files(LexicalIndex.build([]).to_files())
    assert empty.scores("cat").shape == (0,)


def test_units_from_scores_is_maxp_with_the_search_tie_rules():
    rng = np.random.default_rng(0)
    n = 300
    unit_of = [f"u{int(u):02d}" for u in rng.integers(0, 40, n)]
    index = MaxPIndex.build(rng.standard_normal((n, 4)).astype(np.float32), [f"c{i:03d}" for i in range(n)], unit_of)
    scores = rng.integers(0, 6, n).astype(np.float32)  # many ties and zeros
    best: dict[str, tuple[float, int]] = {}
    for i, (u, s) in enumerate(zip(unit_of, scores)):
        if s > 0 and (u not in best or s > best[u][0]):  # the first chunk among equals keeps it
            best[u] = (float(s), i)
    want = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))
    for k in (1, 7, 100):
        got = index.units_from_scores(scores, k)
        assert [(h.unit_id, h.score, h.best_chunk_id) for h in got] == \
            [(u, s, f"c{i:03d}") for u, (s, i) in want[:k]]
    assert index.units_from_scores(np.zeros(n), 5) == []
    with pytest.raises(ValueError, match="one score per chunk"):
        index.units_from_scores(np.zeros(n - 1), 5)


def _hits(ids: str, shard: int = 0) -> list[UnitHit]:
    return [UnitHit(unit_id=u, score=1.0 / (i + 1), best_chunk_id=f"{u}:best", shard=shard) for i, u in enumerate(ids)]


def test_fuse_is_weighted_reciprocal_rank():
    dense, lexical = _hits("abcd"), _hits("dxa")
    got = fuse(dense, lexical, 10, Fusion(lexical_weight=0.5, depth=50, c=60))
    want = {"a": 1 / 61 + 0.5 / 63, "b": 1 / 62, "c": 1 / 63, "d": 1 / 64 + 0.5 / 61, "x": 0.5 / 62}
    assert [h.unit_id for h in got] == sorted(want, key=lambda u: (-want[u], u))
    assert {h.unit_id: round(h.score, 12) for h in got} == {u: round(s, 12) for u, s in want.items()}
    assert {h.unit_id: h.found_by for h in got} == {"a": "dense+bm25", "b": "dense", "c": "dense", "d": "dense+bm25",
                                                     "x": "bm25"}
    assert [h.unit_id for h in fuse(dense, lexical, 2)] == [h.unit_id for h in got][:2]
    # depth cuts each list before fusing; weight 0 leaves the dense order
    assert [h.unit_id for h in fuse(dense, lexical, 10, Fusion(depth=1))] == ["a", "d"]
    assert [h.unit_id for h in fuse(dense, lexical, 4, Fusion(lexical_weight=0.0))] == list("abcd")
    assert rrf_scores([["a", "b"], ["b"]], [1.0, 1.0], c=0) == {"a": 1.0, "b": 1.5}


def test_fusing_merged_shard_lists_equals_fusing_one_index():
    """Each signal's lists merged over the shards, then fused: the ranking of one unsharded index."""
    rng = np.random.default_rng(3)
    units = [f"u{i:02d}" for i in range(30)]
    dense_all = sorted((UnitHit(u, float(rng.random()), f"{u}:d") for u in units), key=lambda h: (-h.score, h.unit_id))
    lex_all = sorted((UnitHit(u, float(rng.random()), f"{u}:l") for u in units[::2]), key=lambda h: (-h.score, h.unit_id))
    fusion = Fusion(lexical_weight=0.7, depth=12)
    want = fuse(dense_all, lex_all, 8, fusion)
    shard_of = {u: i % 3 for i, u in enumerate(units)}
    per_shard = []
    for s in range(3):  # each shard's own top max(k, depth) of each signal
        per_shard.append(([[h for h in dense_all if shard_of[h.unit_id] == s][:12]],
                          [[h for h in lex_all if shard_of[h.unit_id] == s][:12]]))
    got = merge_shards(per_shard, 1, 8, fusion)[0]
    assert [(h.unit_id, h.found_by) for h in got] == [(h.unit_id, h.found_by) for h in want]
    assert merge_topk([d[0] for d, _ in per_shard], 12) == dense_all[:12]


def _write_build(root, n_shards: int = 2) -> tuple[ArtifactStore, Manifest, list[Chunk]]:
    rng = np.random.default_rng(1)
    store = ArtifactStore.open(str(root))
    manifest = Manifest.create(LongRAGConfig(), dim=4, documents=len(TEXTS))
    chunks = [Chunk(chunk_id=f"u{i}:0000", unit_id=f"u{i}", position=0, text=t, n_tokens=8) for i, t in enumerate(TEXTS)]
    for s in range(n_shards):
        mine = [c for i, c in enumerate(chunks) if i % n_shards == s]
        units = [Unit(unit_id=c.unit_id, doc_ids=[c.unit_id], titles=[c.unit_id], text=c.text, n_tokens=8) for c in mine]
        index = MaxPIndex.build(rng.standard_normal((len(mine), 4)).astype(np.float32),
                                [c.chunk_id for c in mine], [c.unit_id for c in mine])
        manifest.add_shard(write_shard(store, s, units, mine, index))
    manifest.mark_complete()
    store.write_manifest(manifest)
    return store, manifest, chunks


def test_write_shard_stores_bm25_with_checksums_and_old_builds_are_named(tmp_path):
    store, manifest, _ = _write_build(tmp_path)
    require_lexical(manifest)  # every shard has it
    lexical = load_shard_lexical(store, 1)
    assert lexical is not None and lexical.n_chunks == 2  # TEXTS[1], TEXTS[3]
    np.testing.assert_allclose(lexical.scores("capital"), lucene_bm25([TEXTS[1], TEXTS[3]], "capital"), rtol=1e-5)
    # a corrupted BM25 file fails its checksum like any shard file
    key = store.shard_key(1, "bm25/data.csc.index.npy")
    store.storage.write_bytes(key, store.storage.read_bytes(key)[:-1] + b"\0")
    with pytest.raises(Exception, match="sha256|checksum|Checksum"):
        load_shard_lexical(store, 1)
    # a build written before hybrid retrieval: no BM25 files in its entries
    for shard in manifest.shards:
        shard.files = {n: e for n, e in shard.files.items() if not n.startswith("bm25/")}
    store.write_manifest(manifest)
    assert load_shard_lexical(store, 0) is None
    with pytest.raises(LexicalIndexMissing, match=r"rebuild it with jobs.index, or use mode=dense") as err:
        require_lexical(manifest)
    assert isinstance(err.value, InvalidRequest)  # a 4xx for a request, not a server error
