"""jobs.gpu_resolve: the GPU set's consistency check on two saved pip reports (trimmed to what the
check reads, tests/jobs/gpu_set/) — the ``gpu`` extra before issue 31 (``faiss-gpu-cu12>=1.8``,
``vllm>=0.6``: pip settles on vLLM 0.19.1, not ray[llm]'s 0.29.0) fails, today's passes — and the
live resolve of today's extra against the package index (network; ~70 s for both Pythons)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from jobs.gpu_resolve import check_report, cuda_major, gpu_requirements, main, torch_cuda_major

FIXTURES = Path(__file__).parent / "gpu_set"


def _report(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_the_old_extra_fails_on_vllm_not_ray_llms_pin():
    result = check_report(_report("report-old-extra-py3.12.json"))
    assert (result["ray"], result["vllm"], result["ray_llm_vllm_pin"]) == ("2.60.0", "0.19.1", "0.29.0")
    assert result["problems"] == ["vllm 0.19.1 is not ray[llm] 2.60.0's pin vllm==0.29.0"]
    assert result["cuda_majors"] == [12]  # faiss-gpu-cu12 held everything at CUDA 12: one major, the wrong vLLM


def test_todays_extra_passes():
    result = check_report(_report("report-gpu-extra-py3.11.json"))
    assert result["problems"] == [], result["problems"]
    assert result["vllm"] == result["ray_llm_vllm_pin"] and result["cuda_majors"] == [13]
    assert result["python"] == "3.11" and result["packages"] > 200


def test_a_cuda_12_faiss_beside_the_cuda_13_set_fails():
    report = copy.deepcopy(_report("report-gpu-extra-py3.11.json"))
    report["install"] += [{"metadata": {"name": "faiss-gpu-cu12", "version": "1.14.1.post1"}},
                          {"metadata": {"name": "nvidia-cuda-runtime-cu12", "version": "12.9.79"}}]
    (problem,) = check_report(report)["problems"]
    assert problem.startswith("CUDA libraries of more than one major: CUDA 12: faiss-gpu-cu12==1.14.1.post1, "
                              "nvidia-cuda-runtime-cu12==12.9.79; CUDA 13: ")
    assert "torch==2.13.0" in problem and "nixl" not in problem  # nixl installs both backends on purpose


def test_a_cpu_torch_or_a_missing_ray_is_named():
    report = copy.deepcopy(_report("report-gpu-extra-py3.11.json"))
    for item in report["install"]:
        if item["metadata"]["name"] == "torch":
            item["metadata"] = {"name": "torch", "version": "2.13.0+cpu"}
    report["install"] = [i for i in report["install"] if i["metadata"]["name"] != "ray"]
    problems = check_report(report)["problems"]
    assert "no ray with a vLLM pin for its llm extra in the set" in problems
    assert "torch 2.13.0+cpu in the set is not a CUDA build" in problems


@pytest.mark.parametrize("name, version, major", [
    ("nvidia-cuda-runtime-cu12", "12.8.90", 12), ("nvidia-cuda-runtime", "13.0.96", 13), ("nvidia_cudnn_cu13", "9.2", 13),
    ("nvidia-cufft", "12.0.0.61", None), ("cupy-cuda12x", "13.4", 12), ("nixl-cu12", "1.3.2", None),
    ("cuda-toolkit", "13.0.3.0", 13), ("numpy", "2.3.5", None), ("faiss-gpu-cu118", "1.8", 11),
])  # fmt: skip
def test_cuda_major_of_a_package(name, version, major):
    assert cuda_major(name, version) == major


def test_torch_cuda_from_its_version_or_its_requirements():
    assert torch_cuda_major({"version": "2.10.0+cu128"}) == 12
    assert torch_cuda_major({"version": "2.13.0+cpu"}) is None
    assert torch_cuda_major({"version": "2.9.0", "requires_dist": ['nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"']}) == 12
    assert torch_cuda_major({"version": "2.13.0", "requires_dist": ['cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"']}) == 13


def test_the_extra_pins_ray_llm_at_the_projects_ray():
    import ray

    requirements = gpu_requirements()
    assert f"ray[llm]=={ray.__version__}" in requirements
    assert not any(r.startswith(("vllm", "faiss-gpu")) for r in requirements)  # they come through ray[llm] / the image


def test_check_mode_exits_1_on_the_old_report(capsys):
    assert main(["--check", str(FIXTURES / "report-old-extra-py3.12.json")]) == 1
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ok"] is False and out["sets"][0]["vllm"] == "0.19.1"


def test_live_resolve_of_the_gpu_extra(capsys):
    """The package index now: the project's dependencies and ``gpu`` extra for Linux x86_64 on both
    Pythons (pip's --dry-run, nothing installed). Fails when a release breaks the set."""
    rc = main([])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0, out
    assert [s["python"] for s in out["sets"]] == ["3.11", "3.12"]
