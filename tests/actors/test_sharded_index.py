"""Sharded MaxP search over IndexShard actors: exactness, failover, coverage, restart, checksums."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import ray

from actors.index_shard import IndexShard
from actors.sharded_index import ShardedIndex
from cluster.local import start_or_join
from longrag.config import LongRAGConfig
from longrag.index.manifest import Manifest
from longrag.index.maxp import MaxPIndex
from longrag.index.artifacts import ArtifactStore, write_shard
from longrag.types import Chunk, Unit

DIM = 16
N_SHARDS = 3


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


def _wait_dead(actor, timeout_s: float = 60.0) -> None:
    """Until calls to ``actor`` fail because it died (the condition, not a fixed sleep)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{actor} still answers {timeout_s} s after ray.kill")


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
    client = ShardedIndex.launch(str(tmp_path), replicas=1, num_cpus=0.1)
    client.wait_ready()
    queries = _queries()
    single = MaxPIndex.build(vectors, [c.chunk_id for c in chunks], [c.unit_id for c in chunks])
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
        assert rows[h.unit_id]["best_chunk_text"] == f"chunk {h.best_chunk_id.split(':')[1].lstrip('0') or '0'} of {h.unit_id}"
    client.kill()


def test_replica_killed_mid_run_fails_over(cluster, tmp_path):
    units, chunks, vectors, _ = _make_build(tmp_path, seed=3)
    client = ShardedIndex.launch(str(tmp_path), replicas=2, num_cpus=0.1, timeout_s=20)
    client.wait_ready()
    queries = _queries(seed=4)
    reference = _brute_force(queries, chunks, vectors, 6)
    failovers, expected = [], []
    for i in range(8):
        if i == 3:  # kill one replica of shard 0 for good, in the middle of the run
            dead = client.replicas[0][0]
            ray.kill(dead, no_restart=True)
            with pytest.raises(ray.exceptions.RayActorError):  # the kill is asynchronous: wait for it
                for _ in range(600):
                    ray.get(dead.ping.remote(), timeout=30)
                    time.sleep(0.05)
        res = client.search_sync(queries, 6)
        assert res.coverage.answered == N_SHARDS, res.coverage
        _assert_same(res.hits, reference)
        failovers.append(res.coverage.failovers)
        # Calls rotate over a shard's replicas (call i starts at replica i % 2): the first call after
        # the kill that starts at the dead replica 0 of shard 0 fails over once; from then on the
        # replica is known not live and is tried last, so no call fails over again.
        expected.append(1 if i == 4 else 0)
        # every result says how many replicas of each shard are live: "1 of 2" once the loss was seen
        assert res.coverage.redundancy_degraded is (i >= 4), (i, res.coverage)
    assert failovers == expected == [0, 0, 0, 0, 1, 0, 0, 0]
    assert res.coverage.redundancy == "shard 0: 1 of 2 replicas; shard 1: 2 of 2 replicas; shard 2: 2 of 2 replicas"
    assert asyncio.run(client.liveness()) == [[False, True], [True, True], [True, True]]
    client.kill()


def test_the_tier_recreates_a_replica_gone_for_good(cluster, tmp_path):
    """A shard actor killed for good (no restart left) frees its name; the holder's repair (run by
    the Retriever's health check) has the lease re-create it under the same name, and the search
    is back to full redundancy once it has loaded."""
    from actors.index_tier import TieredIndex
    from longrag.config import IndexConfig

    _make_build(tmp_path, seed=11)
    config = IndexConfig(replicas=2, shard_num_cpus=0.1)
    tier = TieredIndex(str(tmp_path), config, app_name="repair-test", holder="h1")
    try:
        assert asyncio.run(tier.repair()) == []  # nothing missing: nothing done
        name = tier.tier.prefix + "-s1-r0"
        victim = ray.get_actor(name, namespace=tier.tier.namespace)
        ray.kill(victim, no_restart=True)
        with pytest.raises(ray.exceptions.RayActorError):
            for _ in range(600):
                ray.get(victim.ping.remote(), timeout=30)
                time.sleep(0.05)
        res = asyncio.run(tier.search(_queries(seed=12), 3))
        assert res.coverage.answered == N_SHARDS and res.coverage.redundancy_degraded, res.coverage
        assert "shard 1: 1 of 2 replicas" in res.coverage.redundancy
        assert asyncio.run(tier.repair()) == [(1, 0)]
        again = ray.get_actor(name, namespace=tier.tier.namespace)
        assert again._actor_id != victim._actor_id
        deadline = time.time() + 120
        while not all(all(row) for row in asyncio.run(tier.liveness())):
            assert time.time() < deadline, "the re-created replica did not load"
            time.sleep(0.5)
        res = asyncio.run(tier.search(_queries(seed=12), 3))
        assert not res.coverage.redundancy_degraded and res.coverage.failovers == 0, res.coverage
        assert asyncio.run(tier.repair()) == []
    finally:
        asyncio.run(tier.release())


def test_shard_without_replicas_degrades_not_fails(cluster, tmp_path):
    units, chunks, vectors, unit_shard = _make_build(tmp_path, seed=5)
    client = ShardedIndex.launch(str(tmp_path), replicas=2, num_cpus=0.1, timeout_s=20)
    client.wait_ready()
    for actor in client.replicas[1]:
        ray.kill(actor, no_restart=True)
    for actor in client.replicas[1]:
        _wait_dead(actor)  # ray.kill is asynchronous: a search sent now could still reach the replica
    queries = _queries(seed=6)
    res = client.search_sync(queries, 5)
    cov = res.coverage.to_dict()
    assert cov == {**cov, "shards": N_SHARDS, "answered": N_SHARDS - 1, "degraded": True, "failed_shards": [1]}
    assert "1" in cov["errors"] and cov["errors"]["1"]
    allowed = {u for u, s in unit_shard.items() if s != 1}
    _assert_same(res.hits, _brute_force(queries, chunks, vectors, 5, allowed=allowed))
    client.kill()


def test_restarted_replica_reloads_its_shard(cluster, tmp_path):
    _make_build(tmp_path, seed=7)
    actor = IndexShard.options(num_cpus=0.1).remote(str(tmp_path), 2, True)
    first = ray.get(actor.info.remote())
    ray.kill(actor, no_restart=False)  # crash: Ray restarts it, rerunning __init__
    # The kill is asynchronous: wait until a new process (the restarted replica) answers.
    deadline = time.time() + 90
    while True:
        try:
            again = ray.get(actor.info.remote(), timeout=30)
            if again["pid"] != first["pid"]:
                break
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        if time.time() > deadline:
            raise AssertionError("the killed replica was not restarted")
        time.sleep(0.5)
    assert again["loaded_at"] > first["loaded_at"]
    assert again["pid"] != first["pid"]
    assert again["n_chunks"] == first["n_chunks"] and again["searches"] == 0
    ray.kill(actor, no_restart=True)


def test_corrupted_shard_is_reported_in_coverage(cluster, tmp_path):
    _make_build(tmp_path, seed=9)
    path = tmp_path / "shards" / "shard-00000" / "index.faiss"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    client = ShardedIndex.launch(str(tmp_path), replicas=1, num_cpus=0.1, timeout_s=30)
    res = client.search_sync(_queries(2), 3)
    assert res.coverage.degraded and res.coverage.errors.keys() == {0} and res.coverage.failed_shards == [0]
    assert "ChecksumError" in res.coverage.errors[0] or "sha256" in res.coverage.errors[0]
    client.kill()


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
        for d, (t, x) in enumerate(docs):
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
    client = ShardedIndex.launch(str(tmp_path), replicas=1, num_cpus=0.1)
    client.wait_ready()
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
        assert "doc_scores" not in plain[h.unit_id]
    with pytest.raises(ValueError, match="one question's hits"):  # rows are keyed by unit: one order per unit
        client.fetch_units_sync(hits[:1] * 2, np.repeat(q, 2, 0))
    client.kill()


def _slow_shard_actor():
    """An IndexShard whose searches take ``delay_s`` longer (a local class: Ray ships it by value)."""
    from actors.index_shard import IndexShardReplica

    class SlowShard(IndexShardReplica):
        def __init__(self, uri: str, shard: int, delay_s: float) -> None:
            super().__init__(uri, shard)
            search = self.impl.search

            def slow(queries, k):
                time.sleep(delay_s)
                return search(queries, k)

            self.impl.search = slow

    return ray.remote(max_restarts=0, max_task_retries=0)(SlowShard)


def _wait_for(condition, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while not (value := condition()):
        assert time.time() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.05)
    return value


def test_a_busy_replica_answers_its_health_ping(cluster, tmp_path):
    """A replica in a long search still answers ping and info at once (issue 32: the synchronous
    actor's ping waited behind searches, so a busy replica was marked dead)."""
    _make_build(tmp_path, seed=3)
    actor = _slow_shard_actor().options(num_cpus=0.1).remote(str(tmp_path), 0, 5.0)
    ray.get(actor.ping.remote())
    searching = actor.search.remote(_queries(2), 3)
    _wait_for(lambda: ray.get(actor.info.remote())["busy"] == 1, 10, "the search to start")
    t0 = time.perf_counter()
    assert ray.get(actor.ping.remote(), timeout=2) is True
    assert time.perf_counter() - t0 < 1.0
    index = ShardedIndex([[actor]], timeout_s=30)
    live = asyncio.run(index.liveness(timeout_s=2))
    assert live == [[True]]  # the Retriever's health check finds it live while it searches
    assert len(ray.get(searching)) == 2
    ray.kill(actor, no_restart=True)


def test_a_timed_out_call_is_cancelled_and_fails_over(cluster, tmp_path):
    """Slower than the deadline: the call goes to the other replica, and the slow replica's task is
    cancelled (its busy count drops at once, long before its 5 s search would have ended)."""
    units, chunks, vectors, unit_shard = _make_build(tmp_path, seed=4)
    slow = _slow_shard_actor().options(num_cpus=0.1).remote(str(tmp_path), 0, 5.0)
    fast = IndexShard.options(num_cpus=0.1).remote(str(tmp_path), 0)
    ray.get([slow.ping.remote(), fast.ping.remote()])
    index = ShardedIndex([[slow, fast]], timeout_s=1.0)
    q = _queries(3)
    t0 = time.perf_counter()
    res = index.search_sync(q, 5)
    took = time.perf_counter() - t0
    assert res.coverage.answered == 1 and res.coverage.failovers == 1 and 1.0 <= took < 4.5
    allowed = {u for u, s in unit_shard.items() if s == 0}
    _assert_same(res.hits, _brute_force(q, chunks, vectors, 5, allowed))
    _wait_for(lambda: ray.get(slow.info.remote())["busy"] == 0, 2.5, "the cancelled call to leave the replica")
    assert index.live[0] == [False, True]
    ray.kill(slow, no_restart=True)
    ray.kill(fast, no_restart=True)


def test_a_full_replica_queue_refuses_at_once_and_fails_over(cluster, tmp_path):
    """A replica with max_pending calls queued from this client refuses the next one at once (Ray's
    PendingCallsLimitExceeded) and the call goes to the other replica without waiting."""
    _make_build(tmp_path, seed=5)
    slow = _slow_shard_actor().options(num_cpus=0.1, max_pending_calls=1).remote(str(tmp_path), 0, 3.0)
    fast = IndexShard.options(num_cpus=0.1).remote(str(tmp_path), 0)
    ray.get([slow.ping.remote(), fast.ping.remote()])
    queued = slow.search.remote(_queries(1), 3)  # the one call slow may have pending
    with pytest.raises(ray.exceptions.PendingCallsLimitExceeded):
        slow.search.remote(_queries(1), 3)
    index = ShardedIndex([[slow, fast]], timeout_s=30)
    t0 = time.perf_counter()
    res = index.search_sync(_queries(2), 3)
    assert res.coverage.answered == 1 and res.coverage.failovers == 1 and time.perf_counter() - t0 < 2.5
    assert len(ray.get(queued)) == 1  # the queued call itself is answered
    ray.kill(slow, no_restart=True)
    ray.kill(fast, no_restart=True)


def test_launch_bounds_each_replicas_queue(cluster, tmp_path):
    """ShardedIndex.launch gives each handle index.shard_max_pending (Ray's max_pending_calls), also
    the handles of a second client that finds the named replicas of a tier (get_if_exists)."""
    _make_build(tmp_path, seed=6)
    first = ShardedIndex.launch(str(tmp_path), replicas=1, num_cpus=0.1, max_pending=2, memory_factor=0,
                                name_prefix="bounded")
    first.wait_ready(timeout_s=120)
    second = ShardedIndex.launch(str(tmp_path), replicas=1, num_cpus=0.1, max_pending=2, memory_factor=0,
                                 name_prefix="bounded")
    for index in (first, second):
        actor = index.replicas[0][0]
        refs, refused = [], 0
        for _ in range(20):  # submitted back to back: at most a reply or two can come back in between
            try:
                refs.append(actor.info.remote())
            except ray.exceptions.PendingCallsLimitExceeded:
                refused += 1
        assert refused >= 10 and len(refs) + refused == 20  # unbounded, none would be refused
        ray.get(refs)
    first.kill()


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

    client = ShardedIndex.launch(str(tmp_path), replicas=2, num_cpus=0.1, timeout_s=20)
    client.wait_ready()
    for i in range(6):
        if i == 2:
            dead = client.replicas[1][0]
            ray.kill(dead, no_restart=True)
            _wait_dead(dead)
        res = client.search_sync(queries, 8, texts, fusion)
        assert res.coverage.answered == N_SHARDS and not res.coverage.degraded, res.coverage
        assert [[h.unit_id for h in row] for row in res.hits] == want
        assert [[h.found_by for h in row] for row in res.hits] == [[h.found_by for h in row] for row in got.hits]
    assert res.coverage.redundancy_degraded
    # the units come back from their shards with the best chunk of whichever signal found them
    rows = client.fetch_units_sync(res.hits[0])
    assert set(rows) == {h.unit_id for h in res.hits[0]}
    client.kill()
