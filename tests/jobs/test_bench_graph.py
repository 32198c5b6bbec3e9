"""``jobs.bench graph`` on a small synthetic graph: the figures it prints are there and consistent."""

from __future__ import annotations

import json
from collections import Counter

from lab.bench.cli.graph import main, synthetic_links


def test_small_graph_bench_prints_its_figures(tmp_path, capsys):
    assert main(["--units", "3000", "--degree", "6", "--queries", "20", "--out", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["units"] == 3000 and 0 < summary["links"] <= 9000
    assert summary["memory_mb"] > 0 and summary["memory_mb_per_million_units"] > summary["memory_mb"]
    assert summary["expand_ms"]["n"] == 20 and summary["expand_ms"]["p50_ms"] > 0
    assert (tmp_path / "table.md").read_text().startswith("| measure | value |")
    assert json.loads((tmp_path / "summary.json").read_text())["links"] == summary["links"]


def test_synthetic_links_have_hubs():
    src, dst = synthetic_links(10_000, 10, seed=0)
    assert src.shape == dst.shape == (50_000,)
    counts = sorted(Counter(src.tolist() + dst.tolist()).values())
    assert counts[-1] > 50 * (sum(counts) / len(counts))  # the largest hub has far more than the mean
