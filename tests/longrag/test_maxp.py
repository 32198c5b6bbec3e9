"""MaxP index: exactness against numpy brute force, k' growth, sharding, persistence."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from longrag.index.maxp import INDEX_FILES, MaxPIndex, merge_topk
from longrag.types import UnitHit

faiss.omp_set_num_threads(1)  # OpenMP spinning on a shared 2-core box costs more than it gains here


def brute_force_maxp(
    vectors: np.ndarray, unit_of_chunk: list[str], chunk_ids: list[str], queries: np.ndarray, k: int, metric: str
) -> list[list[tuple[str, float, str]]]:
    """Reference MaxP in float64: unit score = max chunk score; ties -> smaller unit_id; best
    chunk among equal scores -> the first added."""
    x = vectors.astype(np.float64)
    out = []
    for q in queries.astype(np.float64):
        if metric == "ip":
            s = x @ q
        else:
            s = -((x - q) ** 2).sum(axis=1)
        best: dict[str, tuple[float, int]] = {}
        for i, u in enumerate(unit_of_chunk):
            if u not in best or s[i] > best[u][0]:
                best[u] = (float(s[i]), i)
        ranked = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))[:k]
        out.append([(u, sc, chunk_ids[i]) for u, (sc, i) in ranked])
    return out


def assert_same(hits: list[list[UnitHit]], ref: list[list[tuple[str, float, str]]], atol: float = 1e-4) -> None:
    assert len(hits) == len(ref)
    for got, want in zip(hits, ref):
        assert [h.unit_id for h in got] == [u for u, _, _ in want]
        assert [h.best_chunk_id for h in got] == [c for _, _, c in want]
        np.testing.assert_allclose([h.score for h in got], [s for _, s, _ in want], atol=atol, rtol=1e-5)


def random_corpus(rng: np.random.Generator, n_units: int, max_chunks: int, dim: int, integer: bool):
    """Units with 1..max_chunks chunks each; chunk rows of a unit are interleaved with others."""
    sizes = rng.integers(1, max_chunks + 1, size=n_units)
    unit_of_chunk = [f"u{u:04d}" for u in range(n_units) for _ in range(sizes[u])]
    perm = rng.permutation(len(unit_of_chunk))
    unit_of_chunk = [unit_of_chunk[i] for i in perm]
    chunk_ids = [f"c{i:05d}" for i in range(len(unit_of_chunk))]
    if integer:  # small integers: every score is exact in float32, so ties are real ties
        vectors = rng.integers(-2, 3, size=(len(unit_of_chunk), dim)).astype(np.float32)
    else:
        vectors = rng.standard_normal((len(unit_of_chunk), dim)).astype(np.float32)
    return vectors, unit_of_chunk, chunk_ids


@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize("integer", [False, True])
def test_exact_against_brute_force(metric: str, integer: bool) -> None:
    for seed in range(25):
        rng = np.random.default_rng(seed)
        n_units = int(rng.integers(1, 40))
        dim = 6 if integer else 16
        vectors, units, chunks = random_corpus(rng, n_units, 6, dim, integer)
        index = MaxPIndex.build(vectors, chunks, units, metric=metric)
        assert index.ntotal == len(chunks) and index.n_units == n_units and index.dim == dim
        if integer:
            queries = rng.integers(-2, 3, size=(7, dim)).astype(np.float32)
        else:
            queries = rng.standard_normal((7, dim)).astype(np.float32)
        for k in sorted({1, 2, 5, n_units, n_units + 3}):
            ref = brute_force_maxp(vectors, units, chunks, queries, k, metric)
            assert_same(index.search(queries, k), ref)


def test_duplicated_scores_break_ties_by_unit_id() -> None:
    # Every chunk has the same vector: all units tie, order must be unit_id ascending and the
    # best chunk the first added chunk of each unit.
    units = ["b", "a", "c", "a", "b", "d", "c", "a"]
    chunks = [f"c{i}" for i in range(len(units))]
    vectors = np.ones((len(units), 4), dtype=np.float32)
    index = MaxPIndex.build(vectors, chunks, units)
    hits = index.search(np.ones((1, 4), dtype=np.float32), 3)[0]
    assert [h.unit_id for h in hits] == ["a", "b", "c"]
    assert [h.best_chunk_id for h in hits] == ["c1", "c0", "c2"]
    assert all(h.score == 4.0 for h in hits)


def test_k_grows_when_few_units_own_most_chunks() -> None:
    rng = np.random.default_rng(0)
    dim = 8
    q = np.zeros((1, dim), dtype=np.float32)
    q[0, 0] = 1.0
    # Two big units whose 300 chunks all score close to 1; 20 small units score lower.
    big = rng.normal(0, 0.01, size=(600, dim)).astype(np.float32)
    big[:, 0] = 1.0 + rng.uniform(0, 0.1, size=600).astype(np.float32)
    small = rng.normal(0, 0.01, size=(20, dim)).astype(np.float32)
    small[:, 0] = np.linspace(0.9, 0.5, 20, dtype=np.float32)
    vectors = np.vstack([big, small])
    units = ["big0"] * 300 + ["big1"] * 300 + [f"s{i:02d}" for i in range(20)]
    chunks = [f"c{i}" for i in range(len(units))]
    index = MaxPIndex.build(vectors, chunks, units)
    hits, k_used = index.search_with_stats(q, 5)
    ref = brute_force_maxp(vectors, units, chunks, q, 5, "ip")
    assert_same(hits, ref)
    got = [h.unit_id for h in hits[0]]
    assert sorted(got[:2]) == ["big0", "big1"] and got[2:] == ["s00", "s01", "s02"]
    assert k_used[0] >= 603  # had to look past all 600 big-unit chunks
    assert k_used[0] <= index.ntotal
    # Asking for every unit searches every chunk.
    hits, k_used = index.search_with_stats(q, 100)
    assert len(hits[0]) == 22 and k_used[0] == index.ntotal
    assert_same(hits, brute_force_maxp(vectors, units, chunks, q, 100, "ip"))


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_sharded_merge_equals_unsharded_and_brute_force(metric: str) -> None:
    for seed in range(15):
        rng = np.random.default_rng(100 + seed)
        n_units = int(rng.integers(2, 60))
        integer = bool(seed % 2)
        vectors, units, chunks = random_corpus(rng, n_units, 8, 6, integer)
        queries = (
            rng.integers(-2, 3, size=(5, 6)) if integer else rng.standard_normal((5, 6))
        ).astype(np.float32)
        n_shards = int(rng.integers(1, 6))
        shard_of_unit = {u: int(rng.integers(n_shards)) for u in sorted(set(units))}
        shards = []
        for s in range(n_shards):
            rows = [i for i, u in enumerate(units) if shard_of_unit[u] == s]  # a unit never splits
            if not rows:
                continue
            shards.append(
                MaxPIndex.build(vectors[rows], [chunks[i] for i in rows], [units[i] for i in rows], metric=metric)
            )
        full = MaxPIndex.build(vectors, chunks, units, metric=metric)
        for k in (1, 3, 10, n_units):
            ref = brute_force_maxp(vectors, units, chunks, queries, k, metric)
            unsharded = full.search(queries, k)
            per_shard = [shard.search(queries, k) for shard in shards]
            merged = [merge_topk([res[qi] for res in per_shard], k) for qi in range(len(queries))]
            assert_same(unsharded, ref)
            assert_same(merged, ref)
            for a, b in zip(merged, unsharded):
                assert [(h.unit_id, h.best_chunk_id) for h in a] == [(h.unit_id, h.best_chunk_id) for h in b]


def test_merge_topk_ties_and_duplicates() -> None:
    a = [UnitHit("u2", 1.0, "c2"), UnitHit("u5", 0.5, "c5")]
    b = [UnitHit("u1", 1.0, "c1"), UnitHit("u5", 0.7, "c9"), UnitHit("u3", 0.1, "c3")]
    merged = merge_topk([a, b, []], 3)
    assert [(h.unit_id, h.best_chunk_id) for h in merged] == [("u1", "c1"), ("u2", "c2"), ("u5", "c9")]
    assert merge_topk([], 3) == []
    with pytest.raises(ValueError):
        merge_topk([a], 0)


def test_ivf_with_full_probe_is_exact() -> None:
    rng = np.random.default_rng(7)
    vectors, units, chunks = random_corpus(rng, 80, 5, 16, integer=False)
    index = MaxPIndex.build(vectors, chunks, units, factory="IVF4,Flat")
    index.set_search_params("nprobe=4")
    assert faiss.extract_index_ivf(index.index).nprobe == 4
    queries = rng.standard_normal((6, 16)).astype(np.float32)
    assert_same(index.search(queries, 10), brute_force_maxp(vectors, units, chunks, queries, 10, "ip"))


def test_approximate_search_stops_when_the_probes_are_used_up() -> None:
    """IVF with one probe sees a fraction of the chunks: MaxP returns what that fraction holds
    (approximate, possibly under k units) instead of doubling k' up to every chunk."""
    rng = np.random.default_rng(8)
    vectors, units, chunks = random_corpus(rng, 400, 4, 16, integer=False)
    index = MaxPIndex.build(vectors, chunks, units, factory="IVF16,Flat")
    index.set_search_params("nprobe=1")
    queries = rng.standard_normal((8, 16)).astype(np.float32)
    hits, k_used = index.search_with_stats(queries, 10)
    assert (k_used < index.ntotal).all()  # never fell back to scanning every chunk
    exact = brute_force_maxp(vectors, units, chunks, queries, 10, "ip")
    for got, want in zip(hits, exact):
        assert 0 < len(got) <= 10
        scores = [h.score for h in got]
        assert scores == sorted(scores, reverse=True)
        assert scores[0] <= want[0][1] + 1e-5  # an approximate score never beats the exact best
    # more probes, closer to exact; all probes, exact
    index.set_search_params("nprobe=16")
    assert_same(index.search(queries, 10), exact)


def test_hnsw_search_params_and_bad_params() -> None:
    rng = np.random.default_rng(9)
    vectors, units, chunks = random_corpus(rng, 200, 3, 16, integer=False)
    index = MaxPIndex.build(vectors, chunks, units, factory="HNSW16")
    index.set_search_params("efSearch=256")
    queries = rng.standard_normal((5, 16)).astype(np.float32)
    hits = index.search(queries, 5)
    exact = brute_force_maxp(vectors, units, chunks, queries, 5, "ip")
    overlap = np.mean([len({h.unit_id for h in g} & {u for u, _, _ in w}) / 5 for g, w in zip(hits, exact)])
    assert overlap >= 0.8  # 600 vectors, efSearch 256: nearly exact
    with pytest.raises(ValueError, match="nprobe"):
        index.set_search_params("nprobe=4")  # an HNSW index has no inverted lists
    flat = MaxPIndex.build(vectors, chunks, units)
    flat.set_search_params("")  # empty: nothing to set
    with pytest.raises(ValueError):
        flat.set_search_params(5)  # type: ignore[arg-type]


def test_empty_index() -> None:
    index = MaxPIndex.build(np.zeros((0, 5), dtype=np.float32), [], [])
    assert index.ntotal == 0 and index.n_units == 0 and index.dim == 5
    assert index.search(np.ones((3, 5), dtype=np.float32), 4) == [[], [], []]


def test_input_checks() -> None:
    vectors = np.ones((3, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="float32"):
        MaxPIndex.build(vectors.astype(np.float64), ["a", "b", "c"], ["u", "u", "v"])
    with pytest.raises(ValueError, match="2-D"):
        MaxPIndex.build(np.ones(4, dtype=np.float32), ["a"], ["u"])
    with pytest.raises(ValueError, match="strings"):
        MaxPIndex.build(vectors, ["a", "b"], ["u", "u", "v"])
    with pytest.raises(ValueError, match="unique"):
        MaxPIndex.build(vectors, ["a", "a", "c"], ["u", "u", "v"])
    with pytest.raises(ValueError, match="metric"):
        MaxPIndex.build(vectors, ["a", "b", "c"], ["u", "u", "v"], metric="cos")  # type: ignore[arg-type]
    index = MaxPIndex.build(vectors, ["a", "b", "c"], ["u", "u", "v"])
    with pytest.raises(ValueError, match="dimension"):
        index.search(np.ones((1, 3), dtype=np.float32), 1)
    with pytest.raises(ValueError, match="float32"):
        index.search(np.ones((1, 4), dtype=np.float64), 1)
    with pytest.raises(ValueError, match="k must"):
        index.search(np.ones((1, 4), dtype=np.float32), 0)
    with pytest.raises(ValueError, match="NaN"):
        index.search(np.full((1, 4), np.nan, dtype=np.float32), 1)


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_save_load_roundtrip(tmp_path, metric: str) -> None:
    rng = np.random.default_rng(3)
    vectors, units, chunks = random_corpus(rng, 30, 4, 8, integer=False)
    index = MaxPIndex.build(vectors, chunks, units, metric=metric)
    written = index.save(tmp_path / "shard")
    assert sorted(written) == sorted(INDEX_FILES)
    loaded = MaxPIndex.load(tmp_path / "shard")
    assert (loaded.metric, loaded.factory, loaded.dim, loaded.ntotal, loaded.n_units) == (
        metric,
        "Flat",
        8,
        index.ntotal,
        30,
    )
    assert loaded.chunk_units.dtype == np.int32
    np.testing.assert_array_equal(loaded.chunk_units, index.chunk_units)
    queries = rng.standard_normal((4, 8)).astype(np.float32)
    assert loaded.search(queries, 7) == index.search(queries, 7)
    (tmp_path / "shard" / "chunk_ids.parquet").unlink()
    with pytest.raises(FileNotFoundError, match="chunk_ids.parquet"):
        MaxPIndex.load(tmp_path / "shard")


@pytest.mark.parametrize("factory", ["IVF8,PQ8", "IVF8,PQ8,RFlat", "PCA32,IVF8,PQ8", "PQ8"])
def test_pq_indexes_skip_polysemous_training_and_rank_as_faiss_does(factory):
    """PQ's polysemous training only serves polysemous search, which MaxP never uses: it is turned
    off (every PQ inside the factory), and the index ranks chunks as plain FAISS's trained with it."""
    import faiss

    from longrag.index.maxp import skip_polysemous_training

    rng = np.random.default_rng(3)
    v = rng.standard_normal((3000, 64)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    q = v[:5] + 0.01 * rng.standard_normal((5, 64)).astype(np.float32)
    ours = MaxPIndex.build(v, [f"c{i}" for i in range(3000)], [f"u{i}" for i in range(3000)], factory=factory)
    ref = faiss.index_factory(64, factory, faiss.METRIC_INNER_PRODUCT)
    trainer = faiss.PolysemousTraining()  # FAISS's default training: polysemous on (shortened here)
    trainer.n_iter = 2000
    pq_index = faiss.downcast_index(faiss.extract_index_ivf(ref) if "IVF" in factory else ref)
    pq_index.polysemous_training = trainer
    assert pq_index.do_polysemous_training
    ref.train(v)
    ref.add(v)
    assert skip_polysemous_training(faiss.index_factory(64, factory)) == 1
    if "IVF" in factory:  # every list: the same candidates on both sides
        for ix in (ours.index, ref):
            faiss.extract_index_ivf(ix).nprobe = 8
    want_d, want = ref.search(q, 10)
    got_d, got = ours.index.search(q, 10)  # the same FAISS search on the index MaxP trained
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got_d, want_d, rtol=1e-5, atol=1e-6)
