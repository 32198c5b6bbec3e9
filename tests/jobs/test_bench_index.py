"""``python -m jobs.bench index`` at toy sizes: tables, plot and JSON come out and hold together;
a synthetic build serves from an in-process shard with search params and reports its memory."""

from __future__ import annotations

import json

import numpy as np
import pytest

from actors.index_shard import IndexShardImpl
from lab.bench.cli import index as bench_index
from lab.synthetic.vectors import write_synthetic_build
from longrag.index.factories import split_factories, sweep_for

pytestmark = pytest.mark.ray("a")  # starts a local Ray (tests/conftest.py)


def test_split_factories_keeps_ivf_encodings():
    assert split_factories("Flat,IVF{nlist},Flat,IVF{nlist},PQ8,HNSW32", 64) == [
        "Flat", "IVF64,Flat", "IVF64,PQ8", "HNSW32"]
    assert sweep_for("IVF64,Flat")[0] == "nprobe=1" and sweep_for("SQ8") == [""]
    # a re-ranking stage stays with its compressed index, and its sweep sets k_factor_rf
    assert split_factories("IVF{nlist},PQ8,RFlat,IVF{nlist},PQ8,Refine(SQ8),SQ8", 64) == [
        "IVF64,PQ8,RFlat", "IVF64,PQ8,Refine(SQ8)", "SQ8"]
    assert all("k_factor_rf=" in p for p in sweep_for("IVF64,PQ8,RFlat"))


def test_pq_with_exact_reranking_recovers_recall(tmp_path, capsys):
    rc = bench_index.main(["--vectors", "3000", "--dim", "16", "--queries", "20", "--factories",
                           "IVF{nlist},PQ4x4,IVF{nlist},PQ4x4,RFlat", "--skip-cluster", "--skip-overhead",
                           "--plan-chunks", "1000", "--plan-dim", "16", "--plan-factories", "Flat",
                           "--out", str(tmp_path)])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tradeoff"]
    pq = max(r["recall_at_k"] for r in rows if not r["factory"].endswith("RFlat"))
    refined = {r["search_params"]: r for r in rows if r["factory"].endswith("RFlat")}
    assert set(refined) == {"nprobe=8,k_factor_rf=1", "nprobe=8,k_factor_rf=4", "nprobe=32,k_factor_rf=4",
                            "nprobe=32,k_factor_rf=16"}
    best = refined["nprobe=32,k_factor_rf=16"]
    assert best["recall_at_k"] >= max(0.9, pq + 0.05), (pq, refined)
    assert best["queries_per_s"] > 0 and best["bytes_per_vector"] > 4 * 16  # PQ codes + the stored vectors


def test_shard_overhead_at_toy_size(tmp_path, capsys):
    rc = bench_index.main(["--vectors", "6000", "--dim", "32", "--factories", "Flat", "--skip-tradeoff", "--skip-cluster",
                           "--overhead-repeats", "3", "--plan-chunks", "1000", "--plan-dim", "32",
                           "--plan-factories", "Flat", "--out", str(tmp_path)])
    assert rc == 0
    o = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["overhead"]  # exactness is checked inside
    assert o["shards"] == 2 and o["batch"] == 64 and o["vectors"] == 6000
    assert abs(o["ratio"] - o["shards_ms"] / o["single_ms"]) < 0.01 and o["queries_per_s_shards"] > 0


def test_tradeoff_and_plan_at_toy_size(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = bench_index.main(["--vectors", "3000", "--dim", "32", "--queries", "10", "--factories",
                           "Flat,SQ8,IVF{nlist},Flat,HNSW16", "--skip-cluster", "--skip-overhead", "--plan-chunks", "100000",
                           "--plan-dim", "64", "--plan-factories", "Flat,IVF{nlist},SQ8,HNSW16", "--out", str(out)])
    assert rc == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = result["tradeoff"]
    assert {r["factory"] for r in rows} == {"Flat", "SQ8", "IVF219,Flat", "HNSW16"}
    flat = next(r for r in rows if r["factory"] == "Flat")
    assert flat["recall_at_k"] == 1.0 and abs(flat["bytes_per_vector"] - 128.0) < 0.1  # + a small header
    ivf = [r for r in rows if r["factory"].startswith("IVF")]
    assert [r["search_params"] for r in ivf] == ["nprobe=1", "nprobe=8", "nprobe=32"]
    assert ivf[0]["recall_at_k"] <= ivf[-1]["recall_at_k"]
    plan = {r["factory"]: r for r in result["plan"]}
    assert plan["Flat"]["bytes_per_vector"] == 4 * 64 + 4 and plan["Flat"]["scan_ms"] <= 100.0 + 1e-9
    assert plan["HNSW16"]["scan_ms"] == "sublinear"
    assert all(r["n_chunks"] == 100000 and r["nodes"] >= 2 for r in result["plan"])  # 2 replicas
    assert (out / "ann_tradeoff.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "bench_index.json").read_text())["plan"] == result["plan"]


def test_synthetic_build_serves_with_search_params(tmp_path):
    write_synthetic_build(str(tmp_path), [300, 500], 16, 120, 4, seed=0)
    shard = IndexShardImpl(str(tmp_path), 1)
    info = shard.info()
    assert info["n_chunks"] == 500 and info["rss_bytes"] > 0 and info["factory"] == "Flat"
    hits = shard.search(np.ones((1, 16), dtype=np.float32), 3)
    assert len(hits[0]) == 3 and all(h.shard == 1 for h in hits[0])
    unit = shard.get_units([hits[0][0].unit_id])[0]
    assert len(unit["text"]) > 120  # a unit joins several 120-character chunks
