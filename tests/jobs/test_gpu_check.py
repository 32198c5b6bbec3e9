"""jobs.gpu_check run small on this CPU, so the script a GPU machine runs cannot rot: one JSON line, the
CUDA parts reported as skipped, the torch search identical to FAISS's exact top-k, no Ray imported
(a GPU machine has none); its numpy reference (for a machine without FAISS) against FAISS; and the
float16 MiniLM folder it exports for such a machine loading through ``--model-dir``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jobs import gpu_check

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--n", "3000", "--chunks", "4", "--seconds", "0.2", "--queries", "64", "--k", "10",
         "--feed-chunks", "40", "--feed-procs", "2", "--feed-batch", "8", "--feed-block", "16"]


def test_small_cpu_run_prints_one_json_line_without_ray():
    done = subprocess.run([sys.executable, "-m", "jobs.gpu_check", *SMALL, "--cpu"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["ray_imported"] is False and out["gpu"] is None
    assert len(out["skipped"]) == 2 and all("no CUDA" in s for s in out["skipped"])
    emb, search = out["embedder"], out["search"]
    assert emb["device"] == "cpu" and emb["dim"] == 384 and emb["float32_chunks_per_s"] > 0
    assert search["reference"].startswith("faiss") and search["vectors"] == 3000
    exact = search["torch_cpu_float32"]
    assert exact["identical_topk_share"] == 1.0 and exact["qps"]["batch1"] > 0 and exact["qps"]["batch64"] > 0
    assert 0.9 < search["torch_cpu_bfloat16"]["topk_overlap"] <= 1.0
    assert all(v > 0 for v in search["cpu_reference_qps"].values())
    # the build's GPU layout without Ray: 2 tokenizer processes feeding the model every chunk
    feed = out["feed"]
    assert feed["chunks"] == 40 and feed["forward_only_chunks_per_s"] > 0 and feed["tokenize_one_core_chunks_per_s"] > 0
    assert [f["tokenizer_processes"] for f in feed["fed"]] == [2] and feed["fed"][0]["chunks_per_s"] > 0


def test_the_numpy_reference_is_faisss_exact_top_k(monkeypatch):
    xb, xq = gpu_check.unit_vectors(5000, 32, 0), gpu_check.unit_vectors(50, 32, 1)
    with_faiss, search = gpu_check.cpu_reference(xb)
    want_d, want_i = search(xq, 20)
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError
    name, fallback = gpu_check.cpu_reference(xb)
    assert with_faiss.startswith("faiss") and name == "numpy float32"
    got_d, got_i = fallback(xq, 20)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_d, want_d, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_exported_half_precision_model_loads_through_model_dir(tmp_path, capsys):
    folder = tmp_path / "minilm-fp16"
    assert gpu_check.main(["--export-model", str(folder)]) == 0
    exported = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert exported["mib"] < 64  # what can be carried to a machine without the wheel
    assert gpu_check.main([*SMALL, "--cpu", "--model-dir", str(folder)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["embedder"]["model"] == str(folder) and out["embedder"]["dim"] == 384


def test_bad_options_exit_with_a_message(capsys, tmp_path):
    with pytest.raises(SystemExit):
        gpu_check.main(["--n", "5", "--k", "10"])
    assert "more than --n" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_check.main(["--model-dir", str(tmp_path)])
    assert "no config.json" in capsys.readouterr().err
