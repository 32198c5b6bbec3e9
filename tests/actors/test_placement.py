"""Where shard actors go: the index nodes' custom resource, memory from the shard's size, and a GPU
for ``index.device=cuda`` (which fails with a clear configuration error where FAISS has no GPU)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import ray

from actors.index_shard import IndexShardImpl
from actors.sharded_index import IndexNotReady, ShardedIndex, launch_settings
from cluster.local import WORKER_ENV
from longrag.config import LongRAGConfig
from longrag.index.maxp import IndexDeviceError, MaxPIndex, check_gpu
from longrag.index.placement import BASE_BYTES, ShardPlacement, shard_actor_resources, shard_memory_bytes
from longrag.index.artifacts import ArtifactStore
from tests.actors.test_sharded_index import _assert_same, _brute_force, _make_build, _queries

NO_GPU = not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0


# ------------------------------------------------------------------------------ no Ray
def test_actor_asks_follow_the_config_and_the_shard_size(tmp_path):
    _make_build(tmp_path, seed=3)
    entry = ArtifactStore.open(str(tmp_path)).read_manifest().shards[0]
    cfg = LongRAGConfig.model_validate({"index": {"node_resource": "index", "shard_memory_factor": 2.0,
                                                  "shard_num_cpus": 0.5}}).index
    placement = ShardPlacement.of(cfg)
    opts = shard_actor_resources(placement, entry)
    assert opts["num_cpus"] == 0.5 and opts["resources"] == {"index": 1.0} and "num_gpus" not in opts
    est = shard_memory_bytes(entry)
    files = sum(f.bytes for f in entry.files.values())
    assert BASE_BYTES + files < est <= BASE_BYTES + 4 * files  # index files as stored, records expanded
    assert opts["memory"] == int(2.0 * est)
    # defaults: no custom resource (a laptop has none), memory asked, no GPU
    default = shard_actor_resources(ShardPlacement.of(LongRAGConfig().index), entry)
    assert "resources" not in default and default["memory"] == int(1.5 * est)
    cuda = shard_actor_resources(ShardPlacement(device="cuda", num_gpus=0.5, memory_factor=0), entry)
    assert cuda["num_gpus"] == 0.5 and "memory" not in cuda
    with pytest.raises(ValueError, match="index.device must be 'cpu' or 'cuda', got 'tpu'"):
        shard_actor_resources(ShardPlacement(device="tpu"), entry)


def test_launch_settings_carry_the_placement_fields():
    cfg = LongRAGConfig.model_validate({"index": {"device": "cuda", "shard_num_gpus": 0.25,
                                                  "node_resource": "index"}}).index
    launch = launch_settings(cfg)
    assert launch["device"] == "cuda" and launch["num_gpus"] == 0.25 and launch["node_resource"] == "index"
    with pytest.raises(ValueError, match="device"):
        LongRAGConfig.model_validate({"index": {"device": "gpu"}})


@pytest.mark.skipif(not NO_GPU, reason="this FAISS sees a GPU")
def test_cuda_without_a_gpu_is_a_clear_config_error(tmp_path):
    _make_build(tmp_path, seed=4)
    with pytest.raises(IndexDeviceError, match=r"index.device=cuda .*index.device=cpu"):
        check_gpu()
    index = MaxPIndex.build(np.eye(4, dtype=np.float32), list("abcd"), list("abcd"))
    with pytest.raises(IndexDeviceError):
        index.to_gpu()
    assert index.device == "cpu" and len(index.search(np.eye(4, dtype=np.float32)[:1], 2)[0]) == 2
    with pytest.raises(IndexDeviceError, match="gpu extra"):
        IndexShardImpl(str(tmp_path), 0, device="cuda")
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        IndexShardImpl(str(tmp_path), 0, device="tpu")


# ------------------------------------------------------------------------------ a simulated cluster
@pytest.fixture(scope="module")
def cluster():
    """A head without the ``index`` resource and one index node with it (and one logical GPU)."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                      "object_store_memory": 100 * 2**20})
    index_node = c.add_node(num_cpus=2, num_gpus=1, resources={"index": 4}, memory=3 * 2**30,
                            object_store_memory=100 * 2**20)
    c.wait_for_nodes()
    ray.init(address=c.address, runtime_env={"env_vars": WORKER_ENV})
    yield c, index_node
    ray.shutdown()
    c.shutdown()


def test_shard_actors_land_on_the_index_node(cluster, tmp_path):
    c, index_node = cluster
    units, chunks, vectors, _ = _make_build(tmp_path, seed=5)
    client = ShardedIndex.launch(str(tmp_path), replicas=1, num_cpus=0.1, node_resource="index", memory_factor=1.5)
    infos = client.wait_ready(timeout_s=120)
    assert {i["node_id"] for i in infos} == {index_node.node_id}
    assert client.actor_resources["index"] == 1.0 and client.actor_resources["memory_gib"] > 0.3
    queries = _queries(seed=6)
    _assert_same(client.search_sync(queries, 5).hits, _brute_force(queries, chunks, vectors, 5))
    client.kill()
    # without the custom resource the same shards may go anywhere, the head included (SPREAD)
    spread = ShardedIndex.launch(str(tmp_path), replicas=2, num_cpus=0.1)
    assert len({i["node_id"] for i in spread.wait_ready(timeout_s=120)}) == 2
    spread.kill()


def test_a_memory_ask_no_node_has_is_named_when_not_ready(cluster, tmp_path):
    _make_build(tmp_path, seed=7)
    client = ShardedIndex.launch(str(tmp_path), replicas=1, num_cpus=0.1, node_resource="index", memory_factor=50)
    with pytest.raises(IndexNotReady, match=r"memory_gib.*index.shard_memory_factor"):
        client.wait_ready(timeout_s=3, warn_every_s=1)
    client.kill()


@pytest.mark.skipif(not NO_GPU, reason="this FAISS sees a GPU")
def test_cuda_shards_ask_for_a_gpu_and_fail_clearly_without_faiss_gpu(cluster, tmp_path):
    c, index_node = cluster
    _make_build(tmp_path, seed=8)
    client = ShardedIndex.launch(str(tmp_path), replicas=1, num_cpus=0.1, device="cuda", num_gpus=0.3)
    assert client.actor_resources["GPU"] == 0.3
    # scheduled on the node with the (logical) GPU, the actor refuses to load with the config error
    with pytest.raises(Exception, match="IndexDeviceError.*index.device=cuda"):
        client.wait_ready(timeout_s=120)
    client.kill()


def test_the_serve_index_tier_places_its_shards_from_the_config(cluster, tmp_path):
    """``TieredIndex`` (the Retriever's backend) launches its shard actors with the ``index`` config's
    placement: here on the index node, with the memory ask, and reports the ask when not ready."""
    from actors.index_tier import TieredIndex

    c, index_node = cluster
    _make_build(tmp_path, seed=9)
    cfg = LongRAGConfig.model_validate({"index": {"node_resource": "index", "shard_num_cpus": 0.1,
                                                  "shard_memory_factor": 1.2}}).index
    tier = TieredIndex(str(tmp_path), cfg, app_name="placement-test", holder="h1", ready_timeout_s=120)
    try:
        infos = tier.index.wait_ready(timeout_s=60)
        assert {i["node_id"] for i in infos} == {index_node.node_id}
        assert tier.index.actor_resources["index"] == 1.0 and tier.index.actor_resources["memory_gib"] >= 0.3
    finally:
        import asyncio

        assert asyncio.run(tier.tier.release()) == 0
