"""The cluster definitions are checked without a cluster or a network:

* ``cluster/aws.yaml`` with Ray's own cluster-launcher schema: the config ``ray up`` fills with its
  defaults (``prepare_config``) and then validates (``validate_config``, ``ray/autoscaler/ray-schema.json``);
* the KubeRay manifests (``cluster/kuberay/*.yaml``) against the fields of their custom resources,
  written down below from the KubeRay ``ray.io/v1`` API types (``RayClusterSpec``, ``HeadGroupSpec``,
  ``WorkerGroupSpec``, ``RayJobSpec``, ``RayServiceSpec``): required fields present, no field the
  resource does not have, ``rayStartParams`` a map of strings, replicas within bounds;
* ``infra/Dockerfile`` and the manifests pinned to the Ray and Python this suite runs with.

The Serve configs (and the RayService's ``serveConfigV2``) are checked in tests/serve/test_configs.py."""

from __future__ import annotations

import copy
import importlib.util
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

ROOT = Path(__file__).resolve().parents[2]
AWS = ROOT / "cluster" / "aws.yaml"
KUBERAY = ROOT / "cluster" / "kuberay"
DOCKERFILE = ROOT / "infra" / "Dockerfile"

# ---------------------------------------------------------------------------------- KubeRay fields
# (required, known) field names per object, from KubeRay's ray.io/v1 Go types: a field is required
# when its json tag has no omitempty and it is not marked +optional. Only what the manifests use is
# checked deeper (pod templates are Kubernetes' PodTemplateSpec: containers with name and image).
RAY_CLUSTER_SPEC = (
    {"headGroupSpec"},
    {"suspend", "managedBy", "autoscalerOptions", "headServiceAnnotations", "enableInTreeAutoscaling",
     "gcsFaultToleranceOptions", "headGroupSpec", "rayVersion", "workerGroupSpecs"},
)  # fmt: skip
HEAD_GROUP_SPEC = (
    {"template", "rayStartParams"},
    {"template", "headService", "enableIngress", "rayStartParams", "serviceType"},
)
WORKER_GROUP_SPEC = (
    {"groupName", "minReplicas", "maxReplicas", "rayStartParams", "template"},
    {"suspend", "groupName", "replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds", "rayStartParams",
     "template", "scaleStrategy", "numOfHosts"},
)  # fmt: skip
AUTOSCALER_OPTIONS = (
    set(),
    {"resources", "image", "imagePullPolicy", "securityContext", "idleTimeoutSeconds", "upscalingMode", "env",
     "envFrom", "volumeMounts"},
)  # fmt: skip
RAY_JOB_SPEC = (
    set(),
    {"activeDeadlineSeconds", "backoffLimit", "rayClusterSpec", "submitterPodTemplate", "metadata",
     "clusterSelector", "submitterConfig", "managedBy", "deletionPolicy", "entrypoint", "runtimeEnvYAML", "jobId",
     "submissionMode", "entrypointResources", "entrypointNumCpus", "entrypointNumGpus", "ttlSecondsAfterFinished",
     "shutdownAfterJobFinishes", "suspend"},
)  # fmt: skip
RAY_SERVICE_SPEC = (
    set(),
    {"serveConfigV2", "rayClusterConfig", "serviceUnhealthySecondThreshold", "deploymentUnhealthySecondThreshold",
     "serveService", "upgradeStrategy", "excludeHeadPodFromServeSvc"},
)  # fmt: skip
KINDS = {"RayCluster": ("spec", RAY_CLUSTER_SPEC), "RayJob": ("spec", RAY_JOB_SPEC), "RayService": ("spec", RAY_SERVICE_SPEC)}


def _check_fields(obj: Any, fields: tuple[set[str], set[str]], where: str) -> list[str]:
    required, known = fields
    if not isinstance(obj, dict):
        return [f"{where}: expected a mapping, got {type(obj).__name__}"]
    problems = [f"{where}: missing required field {f!r}" for f in sorted(required - set(obj))]
    problems += [f"{where}: unknown field {f!r} (known: {sorted(known)})" for f in sorted(set(obj) - known)]
    return problems


def _check_pod_template(template: Any, where: str) -> list[str]:
    spec = (template or {}).get("spec") if isinstance(template, dict) else None
    containers = (spec or {}).get("containers")
    if not isinstance(containers, list) or not containers:
        return [f"{where}.template.spec.containers: a pod template needs at least one container"]
    return [f"{where}.template.spec.containers[{i}]: needs name and image"
            for i, c in enumerate(containers) if not (isinstance(c, dict) and c.get("name") and c.get("image"))]  # fmt: skip


def _check_start_params(params: Any, where: str) -> list[str]:
    if not isinstance(params, dict):
        return [f"{where}.rayStartParams: expected a map of strings"]
    return [f"{where}.rayStartParams[{k!r}]: {v!r} is not a string (the CRD's type is map[string]string)"
            for k, v in params.items() if not isinstance(v, str)]  # fmt: skip


def check_ray_cluster_spec(spec: Any, where: str) -> list[str]:
    problems = _check_fields(spec, RAY_CLUSTER_SPEC, where)
    if problems and not isinstance(spec, dict):
        return problems
    if "autoscalerOptions" in spec:
        problems += _check_fields(spec["autoscalerOptions"], AUTOSCALER_OPTIONS, f"{where}.autoscalerOptions")
    head = spec.get("headGroupSpec")
    if head is not None:
        problems += _check_fields(head, HEAD_GROUP_SPEC, f"{where}.headGroupSpec")
        if isinstance(head, dict):
            problems += _check_start_params(head.get("rayStartParams", {}), f"{where}.headGroupSpec")
            problems += _check_pod_template(head.get("template"), f"{where}.headGroupSpec")
    groups = spec.get("workerGroupSpecs") or []
    names = [g.get("groupName") for g in groups if isinstance(g, dict)]
    if len(set(names)) != len(names):
        problems.append(f"{where}.workerGroupSpecs: groupName repeats: {names}")
    for i, g in enumerate(groups):
        w = f"{where}.workerGroupSpecs[{i}]"
        problems += _check_fields(g, WORKER_GROUP_SPEC, w)
        if not isinstance(g, dict):
            continue
        problems += _check_start_params(g.get("rayStartParams", {}), w)
        problems += _check_pod_template(g.get("template"), w)
        lo, hi = g.get("minReplicas", 0), g.get("maxReplicas", 2**31 - 1)
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi):
            problems.append(f"{w}: needs integers 0 <= minReplicas <= maxReplicas, got {lo!r}, {hi!r}")
    return problems


def check_manifest(doc: Any, name: str) -> list[str]:
    """Problems of one KubeRay manifest (empty when it matches its resource's fields)."""
    if not isinstance(doc, dict):
        return [f"{name}: not a mapping"]
    problems = []
    if doc.get("apiVersion") != "ray.io/v1":
        problems.append(f"{name}: apiVersion {doc.get('apiVersion')!r}, expected 'ray.io/v1'")
    kind = doc.get("kind")
    if kind not in KINDS:
        return problems + [f"{name}: kind {kind!r} is not one of {sorted(KINDS)}"]
    if not (doc.get("metadata") or {}).get("name"):
        problems.append(f"{name}: metadata.name is required")
    spec = doc.get("spec")
    problems += _check_fields(spec, KINDS[kind][1], f"{name}: spec")
    if not isinstance(spec, dict):
        return problems
    if kind == "RayCluster":
        problems += check_ray_cluster_spec(spec, f"{name}: spec")
    elif kind == "RayJob":
        if "rayClusterSpec" in spec:
            problems += check_ray_cluster_spec(spec["rayClusterSpec"], f"{name}: spec.rayClusterSpec")
        elif "clusterSelector" not in spec:
            problems.append(f"{name}: a RayJob needs rayClusterSpec or clusterSelector")
    elif kind == "RayService":
        problems += check_ray_cluster_spec(spec.get("rayClusterConfig"), f"{name}: spec.rayClusterConfig")
        if not isinstance(spec.get("serveConfigV2"), str):
            problems.append(f"{name}: spec.serveConfigV2 must be a YAML string")
    return problems


MANIFESTS = sorted(p.name for p in KUBERAY.glob("*.yaml"))


def _manifest(name: str) -> dict[str, Any]:
    return yaml.safe_load((KUBERAY / name).read_text())


def _cluster_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]
    return [spec] if doc["kind"] == "RayCluster" else [spec.get("rayClusterSpec") or spec.get("rayClusterConfig")]


def test_every_manifest_is_found():
    assert {"raycluster.yaml", "rayjob-index.yaml", "rayservice.yaml"} <= set(MANIFESTS)


@pytest.mark.parametrize("name", MANIFESTS)
def test_kuberay_manifest_matches_its_resource(name):
    assert check_manifest(_manifest(name), name) == []


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda s: s["headGroupSpec"].pop("template"), "missing required field 'template'"),
        (lambda s: s["workerGroupSpecs"][0].update(maxReplica=3), "unknown field 'maxReplica'"),
        (lambda s: s["workerGroupSpecs"][0].update(minReplicas=9, maxReplicas=2), "minReplicas <= maxReplicas"),
        (lambda s: s["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}), "is not a string"),
        (lambda s: s.update(headGroupSpecs=s.pop("headGroupSpec")), "missing required field 'headGroupSpec'"),
    ],
)
def test_manifest_check_catches_a_broken_cluster_spec(mutate, fragment):
    doc = copy.deepcopy(_manifest("raycluster.yaml"))
    mutate(doc["spec"])
    problems = check_manifest(doc, "raycluster.yaml")
    assert any(fragment in p for p in problems), problems


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifests_pin_the_tested_ray(name):
    for spec in _cluster_specs(_manifest(name)):
        assert spec["rayVersion"] == ray.__version__, (name, spec["rayVersion"])


def test_rayjob_entrypoint_is_a_job_of_this_repository():
    spec = _manifest("rayjob-index.yaml")["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[:2] == ["python", "-m"] and argv[2].startswith("jobs."), argv
    assert importlib.util.find_spec(argv[2]) is not None, argv[2]
    from jobs.index import parse_args

    parse_args(argv[3:])  # the job's own option parser accepts the entrypoint's options


# ---------------------------------------------------------------------------------- aws.yaml


def _validated(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does to a config before it talks to the cloud: fill defaults, then validate
    against ray/autoscaler/ray-schema.json (and Ray's own cross-field checks)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def test_aws_config_passes_the_ray_cluster_schema():
    config = yaml.safe_load(AWS.read_text())
    prepared = _validated(config)
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c["available_node_types"]["gpu_l4"].update(max_worker=4),  # a typo'd field
        lambda c: c["available_node_types"]["gpu_l4"].pop("node_config"),
        lambda c: c.update(head_node_type="gpu"),
        lambda c: c.update(max_workers=-1),
    ],
)
def test_aws_schema_check_catches_a_broken_config(mutate):
    config = yaml.safe_load(AWS.read_text())
    mutate(config)
    with pytest.raises(Exception):  # noqa: B017 - any rejection by the validator
        _validated(config)


# ---------------------------------------------------------------------------------- Dockerfile


def _base_image() -> str:
    m = re.search(r"^ARG BASE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert m, "infra/Dockerfile must name its base image as ARG BASE=..."
    return m.group(1)


def test_dockerfile_pins_the_tested_ray_and_python():
    m = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py(\d)(\d+)", _base_image())
    assert m, f"base image {_base_image()!r} is not rayproject/ray:<version>-py<major><minor>"
    assert m.group(1) == ray.__version__
    assert (int(m.group(2)), int(m.group(3))) == sys.version_info[:2]


def test_dockerfile_installs_the_torch_the_cpu_extra_pins():
    import tomllib

    cpu = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    (pin,) = [d for d in cpu if d.replace(" ", "").startswith("torch==")]
    assert pin.replace(" ", "") in DOCKERFILE.read_text().replace(" ", "")


# ---------------------------------------------------------------------------------- index nodes


def _overrides_node_resource(overrides: list[str]) -> str | None:
    from longrag.config import LongRAGConfig

    return LongRAGConfig().with_overrides(overrides).index.node_resource


def _kuberay_group_resources(group: dict[str, Any]) -> dict[str, float]:
    import json

    raw = group.get("rayStartParams", {}).get("resources")
    return json.loads(json.loads(raw)) if raw else {}


def test_index_node_groups_offer_the_resource_the_serve_configs_ask_for():
    """Shard actors ask for ``index.node_resource`` (actors/sharded_index.py): every cluster
    definition's index node group must offer it, or the shard actors never schedule."""
    serve_configs = ROOT / "serve" / "configs"
    gpu = yaml.safe_load((serve_configs / "gpu.yaml").read_text())
    app = next(a for a in gpu["applications"] if a["name"] == "longrag")
    assert _overrides_node_resource(app["args"]["overrides"]) == "index"
    aws = yaml.safe_load(AWS.read_text())
    assert aws["available_node_types"]["index_cpu"]["resources"].get("index", 0) >= 1
    assert all("index" not in t.get("resources", {}) for n, t in aws["available_node_types"].items() if n != "index_cpu")
    for name in ("raycluster.yaml", "rayservice.yaml"):
        doc = _manifest(name)
        groups = {g["groupName"]: g for g in _cluster_specs(doc)[0]["workerGroupSpecs"]}
        assert _kuberay_group_resources(groups["index-cpu"]).get("index", 0) >= 1, name
        assert "index" not in _kuberay_group_resources(groups["gpu-l4"]), name
    service = yaml.safe_load(_manifest("rayservice.yaml")["spec"]["serveConfigV2"])
    app = next(a for a in service["applications"] if a["name"] == "longrag")
    assert _overrides_node_resource(app["args"]["overrides"]) == "index"


def test_rayservice_workers_are_ready_by_the_apps_readiness_route():
    """Every worker group of the RayService is taken into the Service by ``/readyz`` on the Serve
    port: a path the ingress serves as a probe (no key), on the port the serve config listens on."""
    from serve.routes.health import PROBE_PATHS

    doc = _manifest("rayservice.yaml")
    service = yaml.safe_load(doc["spec"]["serveConfigV2"])
    port = service.get("http_options", {}).get("port", 8000)
    for group in _cluster_specs(doc)[0]["workerGroupSpecs"]:
        (container,) = group["template"]["spec"]["containers"]
        probe = container["readinessProbe"]["httpGet"]
        assert probe == {"path": "/readyz", "port": port} and probe["path"] in PROBE_PATHS, group["groupName"]
        assert "livenessProbe" not in container, "liveness stays KubeRay's raylet check"
