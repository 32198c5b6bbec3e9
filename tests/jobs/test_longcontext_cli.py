"""``python -m jobs.longcontext`` in a subprocess: --retrieve-only on a generated HashHop document
prints one JSON object whose chunks equal the retriever run in process; clear errors (exit 2) for
missing, empty and binary files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.synthetic import generate_hashhop
from longrag.mixpr import MixPRConfig, MixPRRetriever, SparseRetriever

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "jobs.longcontext", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    s = generate_hashhop(4000, 3, seed=2)
    path = tmp_path_factory.mktemp("lc") / "doc.txt"
    path.write_text(s.document, encoding="utf-8")
    return s, path


def test_retrieve_only_json_mixpr_and_sparse(sample):
    s, path = sample
    p = cli("--document", str(path), "--question", s.question, "--retriever", "mixpr", "--k", "10",
            "--route", "local", "--retrieve-only", "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1  # exactly one JSON object on stdout
    out = json.loads(lines[0])
    assert set(out) == {"route", "chunks", "trace"}  # no answer with --retrieve-only
    assert out["route"] == "local" and len(out["chunks"]) == 10
    ref = MixPRRetriever(MixPRConfig(top_k=10)).retrieve(s.document, s.question, route="local")
    assert [c["position"] for c in out["chunks"]] == [c.position for c in ref]
    assert [c["text"] for c in out["chunks"]] == [c.text for c in ref]
    assert all(set(c) == {"position", "text", "score"} for c in out["chunks"])
    got = "\n".join(c["text"] for c in out["chunks"])
    assert all(n in got for n in s.needle_texts())  # the 3-hop chain is in the top 10
    assert out["trace"]["n_chunks"] > 100 and out["trace"]["k"] == 10 and "total_ms" in out["trace"]

    p = cli("--document", str(path), "--question", s.question, "--retriever", "sparse", "--k", "5",
            "--route", "auto", "--retrieve-only", "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    ref = SparseRetriever(MixPRConfig(top_k=5)).retrieve(s.document, s.question)
    assert out["route"] is None and [c["position"] for c in out["chunks"]] == [c.position for c in ref]


def test_bad_files_give_clear_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n ")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x89PNG\x00\x00\x01\x02" * 10)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    cases = [
        (tmp_path / "missing.txt", "not found"),
        (empty, "is empty"),
        (binary, "looks binary"),
        (latin, "not UTF-8"),
        (tmp_path, "not a regular file"),
    ]
    for path, msg in cases:
        p = cli("--document", str(path), "--question", "q?", "--route", "local", "--retrieve-only", "--json")
        assert p.returncode == 2, (path, p.stderr)
        assert msg in p.stderr and "Traceback" not in p.stderr and p.stdout == ""
    p = cli("--document", str(empty), "--k", "0", "--route", "local", "--retrieve-only")
    assert p.returncode == 2
