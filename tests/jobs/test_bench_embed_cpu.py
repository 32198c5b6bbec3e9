"""``jobs.bench embed-cpu`` run for real on the bundled MiniLM, tiny (a child process measures the row): speed,
latency, memory and recall; the recall against a hand-made ranking; the Matryoshka cut."""

from __future__ import annotations

import json

import numpy as np

from lab.bench.cli import embed_cpu as B


def test_settings_rows_and_ratios(tmp_path):
    out = tmp_path / "bench"
    assert B.main(["--settings", "minilm", "--questions", "3", "--chunks", "4", "--threads", "1",
                   "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary["settings"]
    assert row["setting"] == "minilm" and row["paragraphs"] == summary["paragraphs"] > 40
    assert row["chunks_per_s"] > 0 and row["query_p50_ms"] > 0 and row["peak_rss_mb"] > 100
    assert row["chunk_cost_x_minilm"] == 1.0 and 0 <= row["R@2"] <= row["R@5"] <= row["R@10"] <= 100
    assert summary["loadavg_start"] and summary["loadavg_end"] and summary["failed"] == []
    assert "| minilm |" in (out / "table.md").read_text()
    vectors = np.load(out / "vectors-minilm.npz")
    assert vectors["paragraphs"].shape == (row["paragraphs"], 384)
    np.testing.assert_allclose(np.linalg.norm(B.cut(vectors["paragraphs"], 128), axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(B.cut(vectors["paragraphs"], 384), vectors["paragraphs"], atol=1e-6)


def test_recall_counts_all_gold_titles_and_answers():
    from types import SimpleNamespace as NS

    docs = [NS(title="A", text="alpha x"), NS(title="B", text="the answer is Paris"), NS(title="C", text="gamma")]
    examples = [NS(gold_titles=["A", "B"], answers=["Paris"])]
    paragraphs = np.eye(3, dtype=np.float32)
    near_a_then_c = np.array([[1.0, 0.1, 0.5]], dtype=np.float32)
    got = B.recall(near_a_then_c, paragraphs, examples, docs)
    assert (got["R@1"], got["R@2"], got["R@5"]) == (0.0, 0.0, 100.0)  # B is third: both golds only by k=3
    assert (got["AR@2"], got["AR@5"]) == (0.0, 100.0)
