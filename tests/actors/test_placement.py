"""Where shard replicas go: the index nodes' custom resource, memory from the shard's size, and a GPU
for ``index.device=cuda`` (which fails with a clear configuration error where FAISS has no GPU), as
the options of each shard deployment and on a simulated cluster."""

from __future__ import annotations

import asyncio

import faiss
import numpy as np
import pytest
import ray

from actors.index_shard import IndexShardImpl
from actors.sharded_index import IndexNotReady
from cluster.local import WORKER_ENV
from longrag.config import IndexConfig, LongRAGConfig
from longrag.index.artifacts import ArtifactStore
from longrag.index.maxp import IndexDeviceError, MaxPIndex, check_gpu
from longrag.index.placement import BASE_BYTES, ShardPlacement, shard_actor_resources, shard_memory_bytes
from serve.index_app import CONSTRUCTOR_RETRIES, index_app, open_index
from tests.actors.test_sharded_index import _assert_same, _brute_force, _make_build, _queries

pytestmark = pytest.mark.ray("a")  # starts a local Ray (tests/conftest.py)

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


def test_each_shard_deployment_carries_the_config_and_its_shards_ask(tmp_path):
    """The index application's shard deployments: the capacity plan's asks as ``ray_actor_options``,
    ``max_ongoing_requests`` from index.shard_max_pending, at most index.max_replicas_per_node per
    node, index.replicas or Serve's autoscaling, a bounded number of starts for a replica that fails."""
    _make_build(tmp_path, seed=3)
    manifest = ArtifactStore.open(str(tmp_path)).read_manifest()
    cfg = LongRAGConfig.model_validate({"index": {
        "node_resource": "index", "shard_memory_factor": 2.0, "shard_num_cpus": 0.5, "replicas": 2,
        "shard_max_pending": 7, "max_replicas_per_node": 1}}).index
    app = index_app(str(tmp_path), manifest, cfg)
    shards = {d._bound_deployment.name: d._bound_deployment for d in app._bound_deployment.init_args[2:]}
    assert sorted(shards) == [f"shard-{s.shard_id}" for s in manifest.shards]
    for entry in manifest.shards:
        dep = shards[f"shard-{entry.shard_id}"]
        ask = shard_actor_resources(ShardPlacement.of(cfg), entry)
        assert dep.ray_actor_options == {k: ask[k] for k in ("num_cpus", "memory", "resources")}
        assert dep.ray_actor_options["resources"] == {"index": 1.0} and dep.num_replicas == 2
        assert dep.max_ongoing_requests == 7 and dep._deployment_config.max_constructor_retry_count == CONSTRUCTOR_RETRIES
        assert dep._replica_config.max_replicas_per_node == 1
    auto = cfg.model_copy(update={"autoscaling": {"min_replicas": 1, "max_replicas": 3}})
    dep = index_app(str(tmp_path), manifest, auto)._bound_deployment.init_args[2]._bound_deployment
    assert dep._deployment_config.autoscaling_config.max_replicas == 3
    gpu = cfg.model_copy(update={"device": "cuda", "shard_num_gpus": 0.25})
    assert index_app(str(tmp_path), manifest, gpu)._bound_deployment.init_args[2]._bound_deployment \
        .ray_actor_options["num_gpus"] == 0.25
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


def _config(**index) -> IndexConfig:
    return LongRAGConfig.model_validate({"index": {"shard_num_cpus": 0.1, **index}}).index


def test_shard_replicas_land_on_the_index_node(cluster, tmp_path):
    c, index_node = cluster
    units, chunks, vectors, _ = _make_build(tmp_path, seed=5)
    with open_index(str(tmp_path), _config(node_resource="index", shard_memory_factor=1.5)) as client:
        infos = asyncio.run(client.infos())
        assert {i["node_id"] for i in infos} == {index_node.node_id}
        queries = _queries(seed=6)
        _assert_same(client.search_sync(queries, 5).hits, _brute_force(queries, chunks, vectors, 5))


def test_a_memory_ask_no_node_has_is_named_when_not_ready(cluster, tmp_path):
    _make_build(tmp_path, seed=7)
    with pytest.raises(IndexNotReady, match=r"(?s)not RUNNING after 20s.*'memory_gib': .*index.shard_memory_factor"):
        with open_index(str(tmp_path), _config(node_resource="index", shard_memory_factor=50), ready_timeout_s=20):
            pass


@pytest.mark.skipif(not NO_GPU, reason="this FAISS sees a GPU")
def test_cuda_shards_ask_for_a_gpu_and_fail_clearly_without_faiss_gpu(cluster, tmp_path):
    """Scheduled on the node with the (logical) GPU, the replicas refuse to load with the config error."""
    _make_build(tmp_path, seed=8)
    with pytest.raises(IndexNotReady, match=r"(?s)IndexDeviceError.*index.device=cuda"):
        with open_index(str(tmp_path), _config(device="cuda", shard_num_gpus=0.3, shard_memory_factor=0),
                        ready_timeout_s=120):
            pass
