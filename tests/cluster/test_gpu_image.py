"""The GPU node image without building it: ``infra/Dockerfile --build-arg EXTRA=gpu`` starts from Ray's
CUDA image with ``ray[llm]`` at the Ray this suite runs, for the CUDA major the resolved GPU set uses
(the saved pip report, tests/jobs/gpu_set/), while the default build is still Ray's CPU image; and the
``gpu_l4`` nodes of cluster/aws.yaml and the KubeRay manifests' worker groups run the GPU image, the
other workers the CPU one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import ray
import yaml

from jobs.gpu_resolve import PYTHONS, check_report

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "infra" / "Dockerfile"
GPU_IMAGE, CPU_IMAGE = "longrag-ray-gpu:", "longrag-ray:"


def _base_for(extra: str) -> str:
    """The image a build with ``--build-arg EXTRA=<extra>`` starts from, following the Dockerfile's
    global ARGs and named stages as docker does."""
    text = DOCKERFILE.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text.split("\nFROM ", 1)[0], re.M))
    args["EXTRA"] = extra
    stages, last = {}, None
    for image, name in re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M):
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        last = stages.get(image, image)
        if name:
            stages[name] = last
    return last


def test_the_cpu_build_is_rays_cpu_image():
    assert _base_for("cpu") == f"rayproject/ray:{ray.__version__}-py311"


def test_the_gpu_build_is_rays_cuda_llm_image_for_the_resolved_cuda():
    m = re.fullmatch(r"rayproject/ray-llm:(\d+\.\d+\.\d+)-py(\d)(\d+)-cu(\d\d)\d*", _base_for("gpu"))
    assert m, _base_for("gpu")
    assert m.group(1) == ray.__version__
    assert f"{m.group(2)}.{m.group(3)}" in PYTHONS  # a Python the resolver check covers
    resolved = check_report(json.loads((ROOT / "tests" / "jobs" / "gpu_set" / "report-gpu-extra-py3.11.json").read_text()))
    assert resolved["problems"] == [] and resolved["cuda_majors"] == [int(m.group(4))]


def test_the_gpu_build_installs_the_gpu_extra():
    text = DOCKERFILE.read_text()
    assert re.search(r'pip install [^\n]*-e "\.\[\$\{EXTRA\}\]"', text)
    assert re.search(r"^FROM base-\$\{EXTRA\}$", text, re.M) and "\nARG EXTRA\n" in text  # EXTRA reaches RUN


def test_aws_gpu_nodes_run_the_gpu_image():
    aws = yaml.safe_load((ROOT / "cluster" / "aws.yaml").read_text())
    assert CPU_IMAGE in aws["docker"]["image"]
    for name, node in aws["available_node_types"].items():
        image = node.get("docker", {}).get("worker_image", aws["docker"]["image"])
        assert (GPU_IMAGE in image) == (name == "gpu_l4"), (name, image)


def test_kuberay_gpu_groups_run_the_gpu_image():
    seen = 0
    for path in sorted((ROOT / "cluster" / "kuberay").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())["spec"]
        spec = spec.get("rayClusterSpec") or spec.get("rayClusterConfig") or spec
        # The worker groups; a head may run either image (the RayJob's and RayService's run the GPU one,
        # with ray[llm] for the Serve LLM app's build).
        for name, group in [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]:
            for container in group["template"]["spec"]["containers"]:
                gpus = "nvidia.com/gpu" in container.get("resources", {}).get("limits", {})
                assert (GPU_IMAGE in container["image"]) == (name == "gpu-l4") == gpus, (path.name, name)
                seen += name == "gpu-l4"
    assert seen == 3
