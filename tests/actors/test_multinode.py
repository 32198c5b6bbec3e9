"""On a simulated 3-node Ray cluster: the replicas of a shard deployment land on different nodes, and
losing a node keeps every shard answering (a second try now, Serve's replacement on a surviving node)."""

from __future__ import annotations

import time

import pytest

from cluster.local import start_or_join
from tests.actors.test_sharded_index import _assert_same, _brute_force, _make_build, _queries

pytestmark = pytest.mark.ray("a")  # starts a local Ray (tests/conftest.py)


@pytest.fixture(scope="module")
def cluster():
    handle = start_or_join(None, num_cpus=2, nodes=3, object_store_memory=128 * 1024**2)
    yield handle
    handle.shutdown()


def test_serve_shard_replicas_land_on_two_nodes_and_survive_node_loss(cluster, tmp_path):
    """index.max_replicas_per_node=1: the 2 replicas of each shard
    deployment are on 2 nodes; losing a node that hosts some keeps every shard answering (a call that
    met the lost replica is tried again, Serve routes it to the other) and Serve starts the lost
    replicas on a surviving node."""
    import ray
    from ray import serve

    from longrag.config import LongRAGConfig
    from longrag.index.artifacts import ArtifactStore
    from serve.index_app import ServeShards, ensure_index_app, shard_deployment_name

    def replica_nodes(app: str) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for a in ray.util.list_named_actors(all_namespaces=True):
            for s in (0, 1, 2):
                if f"{app}#{shard_deployment_name(s)}#" in a["name"]:
                    actor = ray.get_actor(a["name"], namespace=a["namespace"])
                    try:
                        node = ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()),
                                       timeout=10)
                    except Exception:  # a replica on the lost node, not yet replaced
                        continue
                    out.setdefault(s, []).append(node)
        return out

    while len(cluster.node_handles) < 3:  # the test before this one removed a node
        cluster.add_node(num_cpus=2, object_store_memory=128 * 1024**2)
    units, chunks, vectors, _ = _make_build(tmp_path, seed=21)
    manifest = ArtifactStore.open(str(tmp_path)).read_manifest()
    config = LongRAGConfig().with_overrides(["index.replicas=2", "index.shard_num_cpus=0.5",
                                             "index.max_replicas_per_node=1", "index.search_timeout_s=30"]).index
    serve.start(http_options={"host": "127.0.0.1", "port": 8450})
    try:
        app = ensure_index_app(str(tmp_path), manifest, config, ready_timeout_s=240)
        before = replica_nodes(app)
        assert sorted(before) == [0, 1, 2] and all(len(set(n)) == 2 for n in before.values()), before
        shards = ServeShards(app, manifest, config)
        queries = _queries(seed=22)
        reference = _brute_force(queries, chunks, vectors, 5)
        _assert_same(shards.search_sync(queries, 5).hits, reference)

        victim = next(n for n in cluster.node_handles[1:] if any(n.node_id in nodes for nodes in before.values()))
        cluster.remove_node(victim)
        deadline = time.time() + 180
        while True:
            res = shards.search_sync(queries, 5)
            assert res.coverage.answered == res.coverage.shards, res.coverage
            _assert_same(res.hits, reference)
            now = replica_nodes(app)
            if all(len(set(now.get(s, []))) == 2 and victim.node_id not in now[s] for s in (0, 1, 2)):
                break
            assert time.time() < deadline, f"Serve did not replace the replicas of the lost node: {now}"
            time.sleep(1)
    finally:
        serve.shutdown()
