"""The worker node types of ``cluster/aws.yaml``, what the cluster can grow to, and telling Ray so.

* :func:`scaled_node_types`: the node types of a cluster-launcher YAML, each with the resources its
  instance type has (:data:`INSTANCE_SHAPES`), divided down to fit one machine, keeping every name
  and custom resource (``index``) and the GPU count: the fake multinode cluster of
  :mod:`cluster.fake` is built from these, so the YAML a user deploys is the one under test.
* :func:`max_resources`: what a cluster with an autoscaling config can grow to (every worker node
  type at its ``max_workers``, plus the head), in Ray's resource names.
* :func:`publish_cluster_config`: writes that config where Ray keeps the autoscaler's cluster
  config (the GCS key :func:`cluster.ray_private.max_resources_from_cluster_config` reads,
  as Ray Data does). Ray's open-source autoscaler does not write it itself, so the head does once
  it started: ``python -m cluster.node_types ~/ray_bootstrap_config.yaml`` in ``cluster/aws.yaml``
  (the bootstrap config has each node type's resources filled in from its instance type), and
  :mod:`cluster.fake` for the fake cluster. :func:`actors.embedding.cluster_capacity` reads it.

* :func:`live_nodes`: the worker nodes up now, by node type, as the autoscaler names them.

Only :func:`publish_cluster_config` and :func:`live_nodes` import Ray.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
AWS_YAML = ROOT / "cluster" / "aws.yaml"

#: vCPUs, memory (GiB) and GPUs of the instance types ``cluster/aws.yaml`` names (AWS's published
#: shapes). On AWS, Ray detects these on the instance; a fake node is given them divided down.
INSTANCE_SHAPES: dict[str, tuple[int, int, int]] = {
    "m6i.2xlarge": (8, 32, 0),
    "r6i.4xlarge": (16, 128, 0),
    "g6.2xlarge": (8, 32, 1),
}
GIB = 2**30


def load(path: str | Path) -> dict[str, Any]:
    return yaml.safe_load(Path(path).expanduser().read_text())


def worker_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The node types of a cluster config other than the head's."""
    head = config.get("head_node_type")
    return {name: t for name, t in config["available_node_types"].items() if name != head}


def instance_resources(node_type: dict[str, Any]) -> dict[str, float]:
    """CPU, GPU and memory (bytes) of a node type's instance type (:data:`INSTANCE_SHAPES`)."""
    instance = (node_type.get("node_config") or {}).get("InstanceType")
    if instance not in INSTANCE_SHAPES:
        raise ValueError(f"instance type {instance!r} has no shape in cluster.node_types.INSTANCE_SHAPES "
                         f"(known: {sorted(INSTANCE_SHAPES)})")
    cpus, gib, gpus = INSTANCE_SHAPES[instance]
    return {"CPU": cpus, "memory": gib * GIB, **({"GPU": gpus} if gpus else {})}


def scaled_node_types(config: dict[str, Any], *, cpu_divisor: int = 8, memory_divisor: int = 16,
                      max_workers: dict[str, int] | None = None, default_max: int = 2,
                      object_store_bytes: int = 128 * 2**20) -> dict[str, dict[str, Any]]:
    """The worker node types of a cluster-launcher config, scaled down for one machine.

    Each keeps its name, ``min_workers`` and custom resources (``resources`` in the YAML, e.g.
    ``index: 4``); its CPUs are the instance's divided by ``cpu_divisor`` (at least 1), its
    ``memory`` (what the autoscaler packs memory asks by, e.g. a shard actor's) the instance's
    divided by ``memory_divisor``, its GPUs as many as the instance has (logical GPUs: GPU-shaped
    work is placed as on the cloud and runs on the CPU). Its ``max_workers`` is
    ``max_workers[name]`` or ``default_max``, never above the YAML's."""
    out = {}
    for name, t in worker_types(config).items():
        shape = instance_resources(t)
        resources: dict[str, Any] = {"CPU": max(1, shape["CPU"] // cpu_divisor),
                                     "memory": int(shape["memory"] // memory_divisor),
                                     "object_store_memory": object_store_bytes}
        if shape.get("GPU"):
            resources["GPU"] = shape["GPU"]
        resources.update(t.get("resources") or {})
        cap = (max_workers or {}).get(name, default_max)
        out[name] = {"resources": resources, "node_config": {}, "min_workers": int(t.get("min_workers", 0)),
                     "max_workers": min(int(t.get("max_workers", cap)), cap)}
    return out


def max_resources(config: dict[str, Any]) -> dict[str, float]:
    """What a cluster with this autoscaling config can grow to: every worker node type at its
    ``max_workers`` (``max_workers`` of the cluster ignored, as Ray does) plus the head's
    resources, ``object_store_memory`` left out."""
    total: dict[str, float] = {}
    head = config.get("head_node_type")
    for name, t in config["available_node_types"].items():
        count = 1 if name == head else int(t.get("max_workers", 0))
        for key, value in (t.get("resources") or {}).items():
            if key != "object_store_memory":
                total[key] = total.get(key, 0) + count * float(value)
    return {k: v for k, v in total.items() if v}


def publish_cluster_config(config: dict[str, Any]) -> dict[str, float]:
    """Write the node groups of an autoscaling config to the connected cluster's GCS, where
    :func:`cluster.ray_private.max_resources_from_cluster_config` (Ray Data, Ray Train,
    :func:`actors.embedding.cluster_capacity`) reads what the cluster can grow to. Returns that."""
    import ray

    from cluster import ray_private

    head = config.get("head_node_type")
    groups = [{"name": name, "min_count": 1 if name == head else int(t.get("min_workers", 0)),
               "max_count": 1 if name == head else int(t.get("max_workers", 0)),
               "resources": {k: v for k, v in (t.get("resources") or {}).items() if k != "object_store_memory" and v}}
              for name, t in config["available_node_types"].items()]
    if not ray.is_initialized():
        raise RuntimeError("publish_cluster_config needs a connected Ray (ray.init)")
    ray_private.put_autoscaler_cluster_config(groups)
    return max_resources(config)


def live_nodes(address: str) -> dict[str, str]:
    """``{node_id: node type}`` of the worker nodes alive now (not the head), from the autoscaler's
    cluster status in the GCS; a node the autoscaler did not launch is ``node_<id>``."""
    import ray

    from cluster import ray_private

    heads = {n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n.get("Resources", {})}
    status = ray_private.autoscaler_cluster_status(address)
    return {n.node_id: n.ray_node_type_name for n in [*status.active_nodes, *status.idle_nodes]
            if n.node_id not in heads}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cluster.node_types", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="the head's autoscaling config, e.g. ~/ray_bootstrap_config.yaml")
    p.add_argument("--address", default="auto")
    args = p.parse_args(argv)
    import ray

    ray.init(address=args.address, log_to_driver=False)
    try:
        print(f"published the cluster config: it can grow to {publish_cluster_config(copy.deepcopy(load(args.config)))}")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
