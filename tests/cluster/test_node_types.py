"""The fake multinode cluster's config is derived from ``cluster/aws.yaml`` (no Ray started here):
same worker node types and custom resources, CPUs divided down, a GPU type with GPUs, the head at
0 CPUs, and a config Ray's autoscaler accepts (its own schema and defaults)."""

from __future__ import annotations

import copy

import pytest
from ray.autoscaler._private.util import validate_config

from cluster.fake import BASE_YAML, fake_config
from cluster.node_types import AWS_YAML, INSTANCE_SHAPES, load, max_resources, scaled_node_types, worker_types


def test_every_worker_type_of_aws_yaml_is_scaled_with_its_custom_resources():
    aws = load(AWS_YAML)
    types = scaled_node_types(aws, max_workers={"index_cpu": 1}, default_max=3)
    assert set(types) == set(worker_types(aws)) == {"cpu", "index_cpu", "gpu_l4"}
    for name, t in types.items():
        node = aws["available_node_types"][name]
        vcpus, _, gpus = INSTANCE_SHAPES[node["node_config"]["InstanceType"]]
        assert t["resources"]["CPU"] == max(1, vcpus // 8)
        assert t["resources"].get("GPU", 0) == gpus
        for key, value in (node.get("resources") or {}).items():
            assert t["resources"][key] == value  # e.g. index: 4 on index_cpu
        assert t["min_workers"] == node["min_workers"]
        assert t["max_workers"] == min(node["max_workers"], 1 if name == "index_cpu" else 3)
    assert types["index_cpu"]["resources"]["index"] == 4 and types["gpu_l4"]["resources"]["GPU"] == 1


def test_an_instance_type_without_a_shape_is_refused():
    aws = copy.deepcopy(load(AWS_YAML))
    aws["available_node_types"]["cpu"]["node_config"]["InstanceType"] = "x9.huge"
    with pytest.raises(ValueError, match="x9.huge"):
        scaled_node_types(aws)


def test_the_head_keeps_no_cpus_on_aws_and_in_the_fake_cluster():
    aws = load(AWS_YAML)
    assert aws["available_node_types"][aws["head_node_type"]]["resources"] == {"CPU": 0}
    config = fake_config("127.0.0.1:6390")
    assert config["available_node_types"][config["head_node_type"]]["resources"] == {"CPU": 0}


def test_fake_config_is_accepted_by_rays_autoscaler_schema():
    config = fake_config("127.0.0.1:6390", max_workers={"cpu": 3}, idle_timeout_minutes=0.2)
    validate_config(copy.deepcopy(config))  # as the autoscaler does (prepare_config is `ray up`'s)
    assert config["provider"] == {**load(BASE_YAML)["provider"], "gcs_address": "127.0.0.1:6390"}
    assert config["idle_timeout_minutes"] == 0.2
    assert config["available_node_types"]["cpu"]["max_workers"] == 3
    assert config["max_workers"] == sum(t["max_workers"] for n, t in config["available_node_types"].items()
                                        if n != config["head_node_type"])


def test_max_resources_is_every_type_at_max_workers_plus_the_head():
    config = fake_config("127.0.0.1:6390", max_workers={"cpu": 2, "index_cpu": 1, "gpu_l4": 2})
    # cpu 2 x 1 CPU, index_cpu 1 x (2 CPU, index 4), gpu_l4 2 x (1 CPU, 1 GPU), head 0 CPU
    assert max_resources(config) == {"CPU": 6.0, "index": 4.0, "GPU": 2.0, "memory": (2 * 2 + 8 + 2 * 2) * 2**30}
    # on AWS the bootstrap config carries the detected resources; the head's CPU: 0 adds nothing
    aws = load(AWS_YAML)
    for _name, t in worker_types(aws).items():
        t["resources"] = {**(t.get("resources") or {}), "CPU": INSTANCE_SHAPES[t["node_config"]["InstanceType"]][0]}
    assert max_resources(aws)["CPU"] == 8 * 8 + 8 * 16 + 16 * 8
    assert max_resources(aws)["index"] == 8 * 4


KUBERAY = AWS_YAML.parent / "kuberay"


def _groups(name: str) -> tuple[dict, dict[str, dict]]:
    doc = load(KUBERAY / name)
    spec = doc["spec"]
    spec = spec if doc["kind"] == "RayCluster" else spec.get("rayClusterSpec") or spec.get("rayClusterConfig")
    return spec, {g["groupName"]: g for g in spec["workerGroupSpecs"]}


@pytest.mark.parametrize("name, expected", [("raycluster.yaml", None), ("rayservice.yaml", None),
                                            ("rayjob-index.yaml", {"cpu", "gpu_l4"})])
def test_kuberay_autoscales_the_node_groups_of_aws_yaml(name, expected):
    """The in-tree autoscaler on, a 0-CPU head, and aws.yaml's worker node types as worker groups:
    same names ('_' -> '-'), same custom resources, same maxima, a GPU per gpu-l4 pod."""
    spec, groups = _groups(name)
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    aws = worker_types(load(AWS_YAML))
    assert {g.replace("-", "_") for g in groups} == (expected or set(aws))
    import json

    for group_name, g in groups.items():
        t = aws[group_name.replace("-", "_")]
        custom = json.loads(json.loads(g["rayStartParams"]["resources"])) if "resources" in g["rayStartParams"] else {}
        assert custom == (t.get("resources") or {}), group_name
        assert g["maxReplicas"] == t["max_workers"], group_name
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        vcpus, gib, gpus = INSTANCE_SHAPES[t["node_config"]["InstanceType"]]
        assert (int(limits["cpu"]), int(limits["memory"].removesuffix("Gi")), int(limits.get("nvidia.com/gpu", 0))) \
            == (vcpus, gib, gpus), group_name
