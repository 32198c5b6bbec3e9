"""Sharded MaxP search over a build's shard deployments (one Serve application per build, through
:func:`serve.index_app.open_index`, the jobs' way): exactness, a replica killed mid-run, a shard too
slow to answer (degraded, named, its calls cancelled while the replica answers at once), a corrupted
shard that fails its deployment with the checksum error, documents in evidence order, hybrid."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from ray import serve

from actors.sharded_index import IndexNotReady
from cluster.local import start_or_join
from longrag.config import IndexConfig, LongRAGConfig
from longrag.index.artifacts import ArtifactStore, write_shard
from longrag.index.manifest import Manifest
from longrag.index.maxp import MaxPIndex
from longrag.types import Chunk, Unit
from serve.index_app import ServeShards, index_app, index_app_name, open_index

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)

DIM = 16
N_SHARDS = 3
CONFIG = IndexConfig(shard_num_cpus=0.1, shard_memory_factor=0, search_timeout_s=20)


@pytest.fixture(scope="module")
def cluster():
    handle = start_or_join(None, num_cpus=4)
    yield handle
    handle.shutdown()


WORDS = ("river", "castle", "violin", "comet", "harbor", "glacier", "falcon", "meadow", "lantern", "orchard")


def _make_build(root, seed: int = 0, n_units: int = 40, words: bool = False):
    """Random units with 1..12 chunks each, written as N_SHARDS shards of a complete build; with
    ``words`` each chunk's text also holds three random words of WORDS (for BM25)."""
    rng = np.random.default_rng(seed)
    wrng = np.random.default_rng(seed + 1000)
    units, chunks, vecs = [], [], []
    for u in range(n_units):
        uid = f"u{u:03d}"
        units.append(Unit(unit_id=uid, doc_ids=[str(u)], titles=[f"Title {u}"], text=f"text of unit {u}", n_tokens=10))
        for c in range(int(rng.integers(1, 13))):
            text = f"chunk {c} of {uid}" + ("".join(f" {w}" for w in wrng.choice(WORDS, 3)) if words else "")
            chunks.append(Chunk(chunk_id=f"{uid}:{c:04d}", unit_id=uid, position=c, text=text, n_tokens=5))
            vecs.append(rng.standard_normal(DIM))
    vectors = np.asarray(vecs, dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)

    config = LongRAGConfig()
    store = ArtifactStore.open(str(root))
    manifest = Manifest.create(config, dim=DIM, documents=n_units)
    unit_shard = {u.unit_id: i % N_SHARDS for i, u in enumerate(units)}
    for s in range(N_SHARDS):
        idx = [i for i, c in enumerate(chunks) if unit_shard[c.unit_id] == s]
        shard_chunks = [chunks[i] for i in idx]
        index = MaxPIndex.build(vectors[idx], [c.chunk_id for c in shard_chunks], [c.unit_id for c in shard_chunks])
        shard_units = [u for u in units if unit_shard[u.unit_id] == s]
        manifest.add_shard(write_shard(store, s, shard_units, shard_chunks, index))
    manifest.mark_complete()
    store.write_manifest(manifest)
    return units, chunks, vectors, unit_shard


def _brute_force(queries, chunks, vectors, k, allowed=None):
    """Reference MaxP: a unit's score is the max inner product over its chunks."""
    scores = queries @ vectors.T
    out = []
    for q in range(queries.shape[0]):
        best: dict[str, float] = {}
        for j, c in enumerate(chunks):
            if allowed is not None and c.unit_id not in allowed:
                continue
            best[c.unit_id] = max(best.get(c.unit_id, -np.inf), float(scores[q, j]))
        ranked = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        out.append(ranked)
    return out


def _queries(n=8, seed=1):
    q = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def _assert_same(hits, reference):
    for got, want in zip(hits, reference):
        assert [h.unit_id for h in got] == [u for u, _ in want]
        np.testing.assert_allclose([h.score for h in got], [s for _, s in want], rtol=1e-5, atol=1e-5)


def test_sharded_equals_single_index_and_brute_force(cluster, tmp_path):
    units, chunks, vectors, _ = _make_build(tmp_path)
    queries = _queries()
    single = MaxPIndex.build(vectors, [c.chunk_id for c in chunks], [c.unit_id for c in chunks])
    with open_index(str(tmp_path), CONFIG) as client:
        assert client.app in serve.status().applications and client.n_shards == N_SHARDS
        for k in (1, 5, 17, 40):
            res = client.search_sync(queries, k)
            assert res.coverage.answered == N_SHARDS and not res.coverage.degraded
            _assert_same(res.hits, _brute_force(queries, chunks, vectors, k))
            for got, want in zip(res.hits, single.search(queries, k)):
                assert [h.unit_id for h in got] == [h.unit_id for h in want]
                assert [h.best_chunk_id for h in got] == [h.best_chunk_id for h in want]
        # Units come back from their owning shard, with the best chunk's text.
        hits = client.search_sync(queries[:1], 5).hits[0]
        rows = client.fetch_units_sync(hits)
        assert set(rows) == {h.unit_id for h in hits}
        for h in hits:
            n = h.best_chunk_id.split(':')[1].lstrip('0') or '0'
            assert rows[h.unit_id]["best_chunk_text"] == f"chunk {n} of {h.unit_id}"
        assert [i["n_chunks"] for i in asyncio.run(client.infos())] == [s.n_chunks for s in client.manifest.shards]
        # the Retriever's one-call path (search and rows together) = search, then fetch
        for q in queries[:3]:
            res, units = asyncio.run(client.search_units(q, 7))
            want = client.search_sync(q[None, :], 7).hits[0]
            assert res.hits[0] == want and res.coverage.answered == N_SHARDS
            assert units == asyncio.run(client.retrieve_units(want)) and all(u.text for u in units)
    # the job's application is gone with it, and Serve with it (this driver started it)
    assert not serve.status().applications


def _slow_shard_cls():
    """A shard replica whose searches on shard 1 take 5 s longer (a local class: Ray ships it by value)."""
    from actors.index_shard import IndexShardReplica

    class SlowShard(IndexShardReplica):
        def __init__(self, uri, shard, *rest, **kwargs) -> None:
            super().__init__(uri, shard, *rest, **kwargs)
            if shard == 1:
                search = self.impl.search

                def slow(queries, k):
                    time.sleep(5.0)
                    return search(queries, k)

                self.impl.search = slow

    return SlowShard


def _wait_for(condition, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while not (value := condition()):
        assert time.time() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.05)
    return value


def test_a_shard_too_slow_is_cancelled_named_and_the_rest_answers(cluster, tmp_path):
    """Shard 1 searches for 5 s against a 1 s deadline: both tries time out and are cancelled (the
    replica's busy count drops long before its search would have ended, and it answers ``info``
    at once while its search thread still runs); the result is degraded, names shard 1 and holds
    the other shards' units exactly."""
    units, chunks, vectors, unit_shard = _make_build(tmp_path, seed=5)
    manifest = ArtifactStore.open(str(tmp_path)).read_manifest()
    config = CONFIG.model_copy(update={"search_timeout_s": 1.0})
    name = index_app_name(manifest.build_id)
    serve.start(proxy_location="Disabled")
    try:
        serve.run(index_app(str(tmp_path), manifest, config, shard_cls=_slow_shard_cls()), name=name, route_prefix=None)
        client = ServeShards(name, manifest, config)
        queries = _queries(seed=6)
        t0 = time.perf_counter()
        res = client.search_sync(queries, 5)
        took = time.perf_counter() - t0
        cov = res.coverage.to_dict()
        assert cov == {**cov, "shards": N_SHARDS, "answered": N_SHARDS - 1, "degraded": True, "failed_shards": [1]}
        assert "timed out after 1.0s" in cov["errors"]["1"] and cov["failovers"] == 1 and 2.0 <= took < 4.5, cov
        allowed = {u for u, s in unit_shard.items() if s != 1}
        _assert_same(res.hits, _brute_force(queries, chunks, vectors, 5, allowed=allowed))
        slow = serve.get_deployment_handle("shard-1", app_name=name)
        t1 = time.perf_counter()
        assert slow.info.remote().result(timeout_s=5)["busy"] == 0  # both calls cancelled, the thread still sleeps
        assert time.perf_counter() - t1 < 1.5
    finally:
        serve.shutdown()


def test_a_corrupted_shard_fails_its_deployment_with_the_checksum_error(cluster, tmp_path):
    _make_build(tmp_path, seed=9)
    path = tmp_path / "shards" / "shard-00000" / "index.faiss"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IndexNotReady, match=r"(?s)shard-0.*(ChecksumError|sha256)"):
        with open_index(str(tmp_path), CONFIG, ready_timeout_s=120):
            pass
    assert not serve.status().applications


def test_fetched_units_put_their_best_documents_first(cluster, tmp_path):
    """With the query, each shard returns its units' documents best first; the reference scores
    each document's chunks directly (q . v per chunk, max per document)."""
    rng = np.random.default_rng(3)
    units, chunks, vecs, doc_of_chunk = [], [], [], {}
    for u in range(12):
        uid = f"g{u:03d}"
        docs = [(f"T{u}-{d}", f"doc {d} of {uid}. " * int(rng.integers(1, 4))) for d in range(int(rng.integers(1, 5)))]
        text = "\n\n".join(f"{t}\n{x}" for t, x in docs)
        units.append(Unit(unit_id=uid, doc_ids=[t for t, _ in docs], titles=[t for t, _ in docs], text=text, n_tokens=9))
        pos = 0
        for _d, (t, x) in enumerate(docs):
            for part in (f"{t}\n{x}",):  # one chunk per document, plus a second for some
                pieces = [part] if rng.random() < 0.5 else [part[: len(part) // 2], part[len(part) // 2:]]
                for piece in pieces:
                    cid = f"{uid}:{pos:04d}"
                    chunks.append(Chunk(chunk_id=cid, unit_id=uid, position=pos, text=piece, n_tokens=3))
                    doc_of_chunk[cid] = t
                    vecs.append(rng.standard_normal(DIM))
                    pos += 1
    vectors = np.asarray(vecs, dtype=np.float32)
    store = ArtifactStore.open(str(tmp_path))
    manifest = Manifest.create(LongRAGConfig(), dim=DIM, documents=40)
    for s in range(2):
        mine = [i for i, c in enumerate(chunks) if int(c.unit_id[1:]) % 2 == s]
        index = MaxPIndex.build(vectors[mine], [chunks[i].chunk_id for i in mine], [chunks[i].unit_id for i in mine])
        manifest.add_shard(write_shard(store, s, [u for u in units if int(u.unit_id[1:]) % 2 == s],
                                       [chunks[i] for i in mine], index))
    manifest.mark_complete()
    store.write_manifest(manifest)
    with open_index(str(tmp_path), CONFIG) as client:
        _check_evidence_order(client, chunks, vectors, doc_of_chunk)


def _check_evidence_order(client, chunks, vectors, doc_of_chunk):
    q = _queries(1, seed=5)
    hits = client.search_sync(q, 12).hits[0]
    rows = client.fetch_units_sync(hits, np.repeat(q, len(hits), 0))
    plain = client.fetch_units_sync(hits)
    scores = vectors @ q[0]
    for h in hits:
        best: dict[str, float] = {}
        for j, c in enumerate(chunks):
            if c.unit_id == h.unit_id:
                best[doc_of_chunk[c.chunk_id]] = max(best.get(doc_of_chunk[c.chunk_id], -np.inf), float(scores[j]))
        want = sorted(best, key=lambda t: -best[t])
        assert rows[h.unit_id]["doc_ids"] == want
        np.testing.assert_allclose(rows[h.unit_id]["doc_scores"], [best[t] for t in want], rtol=1e-5)
        assert sorted(rows[h.unit_id]["text"].split("\n\n")) == sorted(plain[h.unit_id]["text"].split("\n\n"))
        assert "doc_scores" not in plain[h.unit_id] and "chunk_scores" not in plain[h.unit_id]
        # each chunk's span in the reordered text holds that chunk, with its score (what the reader packs by)
        # (two chunks of a unit may share a text, each with its own vector: compared as (text, score) pairs)
        text, spans = rows[h.unit_id]["text"], rows[h.unit_id]["chunk_scores"]
        mine = sorted((c.text, float(scores[j])) for j, c in enumerate(chunks) if c.unit_id == h.unit_id)
        got = sorted((text[a:b], s) for a, b, s in spans)
        assert [t for t, _ in got] == [t for t, _ in mine]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in mine], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="one question's hits"):  # rows are keyed by unit: one order per unit
        client.fetch_units_sync(hits[:1] * 2, np.repeat(q, 2, 0))
    # the Retriever's one-call path (search and rows together) puts the documents in the same order
    res, units = asyncio.run(client.search_units(q[0], 12, True))
    assert res.hits[0] == hits and units == asyncio.run(client.retrieve_units(hits, q[0]))
    assert all(u.doc_scores is not None and u.chunk_scores for u in units)
    assert all(u.to_unit().chunk_scores == u.chunk_scores for u in units)


def _hybrid_reference(queries, texts, chunks, vectors, k, fusion):
    """Hybrid by hand over the whole build: dense MaxP and BM25 MaxP (one LexicalIndex per shard,
    as the build writes them), each a global ranking, fused by reciprocal rank."""
    from longrag.index.lexical import LexicalIndex

    dense = _brute_force(queries, chunks, vectors, fusion.depth)
    shard_of = {}
    for c in chunks:
        shard_of.setdefault(c.unit_id, len(shard_of) % N_SHARDS)
    per_chunk = np.zeros((len(texts), len(chunks)))
    for s in range(N_SHARDS):
        idx = [i for i, c in enumerate(chunks) if shard_of[c.unit_id] == s]
        lexical = LexicalIndex.build([chunks[i].text for i in idx])
        for q, t in enumerate(texts):
            per_chunk[q, idx] = lexical.scores(t)
    out = []
    for q in range(len(texts)):
        best: dict[str, float] = {}
        for j, c in enumerate(chunks):
            if per_chunk[q, j] > 0:
                best[c.unit_id] = max(best.get(c.unit_id, 0.0), per_chunk[q, j])
        lex = [u for u, _ in sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:fusion.depth]]
        rrf: dict[str, float] = {}
        for rank, (u, _) in enumerate(dense[q], 1):
            rrf[u] = rrf.get(u, 0.0) + 1.0 / (fusion.c + rank)
        for rank, u in enumerate(lex, 1):
            rrf[u] = rrf.get(u, 0.0) + fusion.lexical_weight / (fusion.c + rank)
        out.append(sorted(rrf, key=lambda u: (-rrf[u], u))[:k])
    return out


def test_hybrid_search_over_shards_and_replicas_survives_a_killed_replica(cluster, tmp_path):
    """Hybrid (MaxP + BM25 fused) over 3 shards x 2 replicas equals the fusion done by hand over the
    whole build, in a Ray cluster and in process, and keeps answering when a replica dies mid-run."""
    from actors.inprocess_index import InProcessIndex
    from longrag.index.fusion import Fusion

    units, chunks, vectors, _ = _make_build(tmp_path, seed=11, words=True)
    fusion = Fusion(lexical_weight=1.0, depth=10)  # weight 1: a unit only BM25 finds can reach the top 8
    queries = _queries(n=6, seed=12)
    texts = ["river castle", "violin", "comet harbor glacier", "the of", "falcon meadow", "lantern orchard river"]
    want = _hybrid_reference(queries, texts, chunks, vectors, 8, fusion)
    local = InProcessIndex(str(tmp_path), LongRAGConfig().index)
    got = local.search_sync(queries, 8, texts, fusion)
    assert [[h.unit_id for h in row] for row in got.hits] == want
    assert {h.found_by for row in got.hits for h in row} == {"dense", "bm25", "dense+bm25"}

    from serve.faults import kill_index_replicas

    with open_index(str(tmp_path), CONFIG.model_copy(update={"replicas": 2})) as client:
        for i in range(8):
            if i == 2:  # one replica of shard 1 killed for good: Serve routes around it and replaces it
                kill_index_replicas(client.manifest.build_id, 1, 1)
            res = client.search_sync(queries, 8, texts, fusion)
            assert res.coverage.answered == N_SHARDS and not res.coverage.degraded, res.coverage
            assert [[h.unit_id for h in row] for row in res.hits] == want
            assert [[h.found_by for h in row] for row in res.hits] == [[h.found_by for h in row] for row in got.hits]
        # the units come back from their shards with the best chunk of whichever signal found them
        rows = client.fetch_units_sync(res.hits[0])
        assert set(rows) == {h.unit_id for h in res.hits[0]}
        # Serve's counts say 1 of 2 while the replacement starts, then 2 of 2 again
        _wait_for(lambda: asyncio.run(client.liveness())[1].live == 2, 120, "the killed replica's replacement")


def test_graph_expansion_over_shards_and_replicas_survives_a_killed_replica(cluster, tmp_path):
    """retrieval.mode=graph as the jobs run it over 3 shards x 2 replicas (the dense top 10 merged
    over the shards, re-ranked with the unit link graph, the rows fetched with the query): the same
    units as the expansion of the brute-force dense list, a unit only the walk reached comes back
    with its own best chunk for the query (picked by its shard), and a replica killed mid-run
    changes nothing."""
    from longrag.index.artifacts import read_unit_graph, write_unit_graph
    from longrag.index.graph import GRAPH_FILE, GraphExpansion, expand, unit_graph_from_labels
    from longrag.types import UnitHit

    units, chunks, vectors, unit_shard = _make_build(tmp_path, seed=21)
    ids = [u.unit_id for u in units]
    rng = np.random.default_rng(22)
    src, dst = rng.integers(0, len(units), 60), rng.integers(0, len(units), 60)
    store = ArtifactStore.open(str(tmp_path))
    manifest = store.read_manifest()
    manifest.artifacts[GRAPH_FILE] = write_unit_graph(
        store, unit_graph_from_labels(ids, [unit_shard[u] for u in ids], np.arange(len(units)), src, dst))
    store.write_manifest(manifest)
    graph = read_unit_graph(store)
    settings = GraphExpansion(depth=10, seeds=3)
    queries = _queries(n=5, seed=23)
    want = [expand([UnitHit(unit_id=u, score=s, best_chunk_id="", shard=unit_shard[u]) for u, s in row], graph, 8,
                   settings) for row in _brute_force(queries, chunks, vectors, 10)]
    assert any(h.found_by == "graph" for row in want for h in row), "the graph must bring in units of its own"
    scores = queries @ vectors.T
    with open_index(str(tmp_path), CONFIG.model_copy(update={"replicas": 2})) as client:
        for i in range(4):
            if i == 1:
                from serve.faults import kill_index_replicas

                kill_index_replicas(client.manifest.build_id, 2, 0)
            res = client.search_sync(queries, 10)
            assert res.coverage.answered == N_SHARDS and not res.coverage.degraded, res.coverage
            for q, hits in enumerate(res.hits):
                got = expand(hits, graph, 8, settings)
                assert [(h.unit_id, h.found_by) for h in got] == [(h.unit_id, h.found_by) for h in want[q]]
                rows = client.fetch_units_sync(got, np.repeat(queries[q][None, :], len(got), 0), evidence=False)
                for h in got:
                    row = rows[h.unit_id]
                    assert row["doc_ids"] == [h.unit_id[1:].lstrip("0") or "0"]  # stored order (one document)
                    mine = [j for j, c in enumerate(chunks) if c.unit_id == h.unit_id]
                    best = chunks[max(mine, key=lambda j: scores[q, j])]
                    if h.found_by == "graph":
                        assert row["best_chunk_id"] == best.chunk_id and row["best_chunk_text"] == best.text
                    else:
                        assert row["best_chunk_text"] == best.text and "doc_scores" not in row


# ------------------------------------------------------------------ without Ray: fake shard handles
class _FakeShard:
    """A shard deployment's handle in process: ``handle.search.remote(q, k)`` and ``get_units`` are
    awaitables with ``cancel()`` (as Serve's ``DeploymentResponse``); ``fetch_error`` makes every
    ``get_units`` fail (the shard answered its search, then lost its replica)."""

    def __init__(self, shard: int, units: list[str], fetch_error: Exception | None = None) -> None:
        self.shard, self.units, self.fetch_error = shard, units, fetch_error

    def _search(self, queries, k):
        from longrag.types import UnitHit

        return [[UnitHit(unit_id=u, score=1.0 - i / 100 - self.shard / 1000, best_chunk_id=f"{u}:0000",
                         shard=self.shard) for i, u in enumerate(self.units[:k])] for _ in range(len(queries))]

    def _get_units(self, unit_ids, chunk_ids=None, queries=None, evidence=True):
        if self.fetch_error is not None:
            raise self.fetch_error
        return [{"unit_id": u, "doc_ids": [u], "titles": [f"Title {u}"], "n_tokens": 3, "text": f"text of {u}",
                 "best_chunk_text": f"chunk of {u}"} for u in unit_ids]

    def __getattr__(self, method):
        impl = getattr(self, f"_{method}")

        class _Method:
            def remote(self, *args):
                async def call():
                    return impl(*args)

                return asyncio.ensure_future(call())

        return _Method()


def test_a_failed_winners_only_fetch_makes_the_coverage_degraded_and_names_the_units():
    """Issue 44 item 3.3: above ``fused_fetch_max_units`` the winners are fetched after the search; a
    shard that answered its search but not the fetch (both tries failed) leaves its units without
    text: the coverage says degraded, names the shard (with its error) and the units, instead of only
    logging it."""
    from actors.sharded_index import ShardedIndex

    handles = [_FakeShard(0, ["a0", "a1"]), _FakeShard(1, ["b0", "b1"], RuntimeError("replica lost mid-fetch"))]
    index = ShardedIndex(handles, timeout_s=1.0, fused_fetch_max_units=1)  # 2 shards x k=2 > 1: winners only
    res, units = asyncio.run(index.search_units(np.zeros(DIM, dtype=np.float32), 2))
    cov = res.coverage
    assert cov.answered == 2 and cov.degraded, cov
    assert set(cov.fetch_errors) == {1} and "replica lost mid-fetch" in cov.fetch_errors[1], cov
    missing = [u.unit_id for u in units if u.text is None]
    assert missing and sorted(cov.unfetched) == sorted(missing) and all(u.startswith("b") for u in missing), cov
    assert cov.to_dict()["degraded"] is True and cov.to_dict()["fetch_errors"] == {"1": cov.fetch_errors[1]}
    # every fetch answered: nothing named, not degraded
    handles[1].fetch_error = None
    res, units = asyncio.run(index.search_units(np.zeros(DIM, dtype=np.float32), 2))
    assert not res.coverage.degraded and res.coverage.fetch_errors == {} and res.coverage.unfetched == []
    assert all(u.text for u in units)
