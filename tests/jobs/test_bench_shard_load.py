"""``jobs.bench shard-load`` on a small shard: the three settings, each in its own process, find the same
shard; the warm cache hashes nothing and the first one hashes every file once."""

from __future__ import annotations

import json

from lab.bench.cli import shard_load as B


def test_three_settings_one_json_line(tmp_path, capsys):
    assert B.main(["--vectors", "3000", "--dim", "16", "--searches", "3", "--out", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {r["setting"]: r for r in out["results"]}
    assert list(rows) == list(B.SETTINGS)
    assert {r["vectors"] for r in rows.values()} == {3000} and {r["units"] for r in rows.values()} == {300}
    assert rows["cache, first load"]["hashed"] == 6 and rows["cache, first load"]["cache_hits"] == 0
    assert rows["cache, warm"]["hashed"] == 0 and rows["cache, warm"]["cache_hits"] == 6


def test_a_shard_build_stays_under_the_memory_it_declares(tmp_path, capsys):
    """Issue 40, item 6: the build task's peak RSS (sampled) against longrag.index.capacity.shard_build_bytes."""
    assert B.main(["--build", "--vectors", "20000", "--dim", "64", "--text-bytes", "300", "--out", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["chunks"] == 20000 and out["text_mb"] > 5
    assert out["peak_rss_mb"] > out["start_rss_mb"] and 0 < out["peak_over_declared"] < 1, out
