"""The GPU set resolved for Linux x86_64 without a GPU and without installing it: ``pip install --dry-run
--report`` of the project's dependencies plus its ``gpu`` extra, for each Python the project supports,
and the report checked — vLLM is the version ``ray[llm]`` pins at the resolved Ray (what
``ray.serve.llm`` is released and tested with), torch is a CUDA build, and every CUDA library in the
set is of one CUDA major. Exit status 1 naming each problem; ends with one JSON line.

    python -m jobs.gpu_resolve                                  (Python 3.11 and 3.12, in parallel)
    python -m jobs.gpu_resolve --python 3.12 --report-dir out/  (keep pip's reports)
    python -m jobs.gpu_resolve --check out/report-py3.12.json   (check a saved report only)

pip resolves for ``--platform manylinux_2_35_x86_64`` down to ``manylinux2014`` (glibc 2.35: Ubuntu
22.04, the Ray images' base) with ``--only-binary=:all:``; this machine's own pip configuration
(local wheel folders, constraint files) is left out, so the answer is the package index's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ("3.11", "3.12")
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(35, 16, -1)] + ["manylinux2014_x86_64"]
MULTI_BACKEND = ("nixl", "nvidia-cutlass-dsl-libs")
"""Families whose meta package installs the CUDA 12 and the CUDA 13 build side by side and picks one at
run time from torch's CUDA (``nixl`` -> ``nixl-cu12`` + ``nixl-cu13``): not a second CUDA in the set."""
VERSIONED_LIKE_CUDA = ("cuda-toolkit", "cuda-bindings", "cuda-python", "nvidia-cublas", "nvidia-nvjitlink",
                       "nvidia-nvtx", "nvidia-nvvm")
"""Unsuffixed packages whose version's major is the CUDA major (as is every ``nvidia-cuda-*``); the other
unsuffixed CUDA 13 libraries (``nvidia-cufft`` 12.x, ``nvidia-curand`` 10.x) carry their own numbering
and come pinned by ``cuda-toolkit``, whose major is checked."""


def gpu_requirements(pyproject: Path = ROOT / "pyproject.toml", extra: str = "gpu") -> list[str]:
    """The project's dependencies plus the ``extra`` extra, as pip takes them."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"][extra])


def resolve(requirements: list[str], python: str, report: Path, timeout_s: float = 600) -> dict[str, Any]:
    """pip's ``--dry-run --report`` of ``requirements`` for Linux x86_64 and ``python``; raises
    RuntimeError with pip's last lines when it finds no set."""
    with tempfile.TemporaryDirectory(prefix="gpu-resolve-") as target:
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                "--report", str(report), "--target", target, "--python-version", python,
                "--only-binary=:all:", *(a for p in PLATFORMS for a in ("--platform", p)), *requirements]
        env = {k: v for k, v in os.environ.items()
               if k not in ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX")}
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
        raise RuntimeError(f"pip found no GPU set for Python {python}:\n{tail}")
    return dict(json.loads(report.read_text()), target_python=python)  # "environment" is this machine's


def _packages(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {_norm(i["metadata"]["name"]): i["metadata"] for i in report["install"]}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _major_of_suffix(digits: str) -> int:
    return int(digits[:2]) if len(digits) > 2 else int(digits)  # cu12 -> 12, cu128 -> 12, cu118 -> 11


def cuda_major(name: str, version: str) -> int | None:
    """The CUDA major a package is built for, where its name or version says it; None otherwise."""
    name = _norm(name)
    m = re.fullmatch(r"(.+)-cu(\d+)", name) or re.fullmatch(r"(cupy)-cuda(\d+)x", name)
    if m:
        return None if m.group(1) in MULTI_BACKEND else _major_of_suffix(m.group(2))
    if name.startswith("nvidia-cuda-") or name in VERSIONED_LIKE_CUDA:
        return int(version.split(".")[0])
    return None


def torch_cuda_major(meta: dict[str, Any]) -> int | None:
    """torch's CUDA: its local version (``+cu128``) or the CUDA runtime it requires; None for a CPU build."""
    local = meta["version"].partition("+")[2]
    if local:
        m = re.fullmatch(r"cu(\d+)", local)
        return _major_of_suffix(m.group(1)) if m else None
    for req in meta.get("requires_dist") or []:
        m = re.match(r"(cuda-toolkit|nvidia-cuda-runtime(?:-cu(\d+))?)\b[^;]*?==\s*(\d+)", req)
        if m:
            return _major_of_suffix(m.group(2)) if m.group(2) else int(m.group(3))
    return None


def ray_llm_vllm_pin(ray_meta: dict[str, Any]) -> str | None:
    """The vLLM version ``ray[llm]`` pins (``vllm[audio]==0.29.0; extra == "llm"``)."""
    for req in ray_meta.get("requires_dist") or []:
        m = re.match(r"vllm(\[[^\]]*\])?\s*==\s*([^;\s]+)\s*;.*extra\s*==\s*['\"]llm['\"]", req)
        if m:
            return m.group(2)
    return None


def check_report(report: dict[str, Any]) -> dict[str, Any]:
    """What the set holds (ray, vLLM and ray[llm]'s pin, torch and its CUDA, the CUDA majors) and the
    problems found: ``problems`` is empty when the set is consistent."""
    pkgs, problems = _packages(report), []
    ray, vllm, torch = pkgs.get("ray"), pkgs.get("vllm"), pkgs.get("torch")
    pin = ray_llm_vllm_pin(ray) if ray else None
    if ray is None or pin is None:
        problems.append("no ray with a vLLM pin for its llm extra in the set")
    if vllm is None:
        problems.append("no vllm in the set")
    elif pin is not None and vllm["version"] != pin:
        problems.append(f"vllm {vllm['version']} is not ray[llm] {ray['version']}'s pin vllm=={pin}")
    torch_major = torch_cuda_major(torch) if torch else None
    if torch_major is None:
        problems.append(f"torch {torch['version'] if torch else '(none)'} in the set is not a CUDA build")
    majors: dict[int, list[str]] = {}
    for name, meta in sorted(pkgs.items()):
        major = cuda_major(name, meta["version"])
        if major is not None:
            majors.setdefault(major, []).append(f"{name}=={meta['version']}")
    if torch_major is not None:
        majors.setdefault(torch_major, []).append(f"torch=={torch['version']}")
    if len(majors) > 1:
        problems.append("CUDA libraries of more than one major: " + "; ".join(
            f"CUDA {m}: {', '.join(sorted(names))}" for m, names in sorted(majors.items())))
    python = report.get("target_python") or report.get("environment", {}).get("python_version")
    return {"python": python, "ray": ray and ray["version"],
            "vllm": vllm and vllm["version"], "ray_llm_vllm_pin": pin, "torch": torch and torch["version"],
            "cuda_majors": sorted(majors), "packages": len(pkgs), "problems": problems}


def trim_report(report: dict[str, Any]) -> dict[str, Any]:
    """A report cut down to what :func:`check_report` reads (saved as a test fixture)."""
    keep = {"ray", "torch", "vllm"}
    return {"version": report.get("version"), "pip_version": report.get("pip_version"),
            "target_python": report.get("target_python"),
            "install": [{"metadata": {k: v for k, v in i["metadata"].items() if k in ("name", "version")
                                      or (k == "requires_dist" and _norm(i["metadata"]["name"]) in keep)}}
                        for i in report["install"]]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from longrag.cli import choice_list, number

    p = argparse.ArgumentParser(prog="python -m jobs.gpu_resolve", description=__doc__.split("\n\n")[0])
    p.add_argument("--python", type=choice_list(PYTHONS), default=list(PYTHONS), help="comma list of Pythons")
    p.add_argument("--extra", default="gpu", help="the extra resolved beside the dependencies (default gpu)")
    p.add_argument("--report-dir", type=Path, default=None, help="keep pip's reports here (report-py<X>.json)")
    p.add_argument("--trim", action="store_true", help="with --report-dir: save the trimmed reports")
    p.add_argument("--check", type=Path, nargs="+", default=None, help="check saved reports instead of resolving")
    p.add_argument("--timeout-s", type=number(float, min_value=1), default=600, help="per pip run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    if args.check:
        results = [dict(check_report(json.loads(path.read_text())), report=str(path)) for path in args.check]
    else:
        requirements = gpu_requirements(extra=args.extra)
        with tempfile.TemporaryDirectory(prefix="gpu-reports-") as tmp:
            folder = args.report_dir or Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)

            def one(python: str) -> dict[str, Any]:
                path = folder / f"report-py{python}.json"
                try:
                    report = resolve(requirements, python, path, args.timeout_s)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    return {"python": python, "problems": [str(exc)]}
                if args.trim:
                    path.write_text(json.dumps(trim_report(report), indent=1) + "\n")
                return check_report(report)

            with ThreadPoolExecutor(len(args.python)) as pool:
                results = list(pool.map(one, args.python))
    for r in results:
        print(f"Python {r['python']}: " + ("; ".join(r["problems"]) if r["problems"] else
              f"ok: ray {r['ray']}, vllm {r['vllm']} (ray[llm] pins {r['ray_llm_vllm_pin']}), torch {r['torch']}, "
              f"CUDA {r['cuda_majors']}"), file=sys.stderr)
    ok = all(not r["problems"] for r in results)
    print(json.dumps({"ok": ok, "seconds": round(time.perf_counter() - t0, 1), "sets": results}))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
