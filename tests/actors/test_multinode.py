"""On a simulated 3-node Ray cluster: replicas of a shard land on different nodes, and losing a
node keeps every shard answering (failover now, restart-and-reload on a surviving node)."""

from __future__ import annotations

import time

import pytest

from actors.sharded_index import ShardedIndex
from cluster.local import start_or_join
from tests.actors.test_sharded_index import _assert_same, _brute_force, _make_build, _queries


@pytest.fixture(scope="module")
def cluster():
    handle = start_or_join(None, num_cpus=2, nodes=3, object_store_memory=128 * 1024**2)
    yield handle
    handle.shutdown()


def test_replicas_spread_and_survive_node_loss(cluster, tmp_path):
    units, chunks, vectors, _ = _make_build(tmp_path, seed=11)
    client = ShardedIndex.launch(str(tmp_path), replicas=2, num_cpus=0.5, timeout_s=30)
    infos = client.wait_ready()
    nodes_by_shard: dict[int, set[str]] = {}
    for info in infos:
        nodes_by_shard.setdefault(info["shard_id"], set()).add(info["node_id"])
    assert all(len(nodes) == 2 for nodes in nodes_by_shard.values()), nodes_by_shard

    queries = _queries(seed=12)
    reference = _brute_force(queries, chunks, vectors, 5)
    _assert_same(client.search_sync(queries, 5).hits, reference)

    # Lose a worker node that hosts shard replicas.
    worker_nodes = cluster.node_handles[1:]
    victim = next(n for n in worker_nodes if any(i["node_id"] == n.node_id for i in infos))
    cluster.remove_node(victim)
    deadline = time.time() + 120
    while True:
        res = client.search_sync(queries, 5)
        assert res.coverage.answered == res.coverage.shards, res.coverage  # the other replica answers
        _assert_same(res.hits, reference)
        # The lost replicas come back on surviving nodes (Ray restarts them; they reload their shard).
        try:
            infos_after = client.wait_ready(timeout_s=10)
            if all(i["node_id"] != victim.node_id for i in infos_after):
                break
        except Exception:
            pass
        if time.time() > deadline:
            raise AssertionError("replicas on the removed node did not restart elsewhere")
        time.sleep(1)
    client.kill()
