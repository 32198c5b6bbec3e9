"""The scale benchmark runs end to end on small sizes and ends with its JSON line (no Ray)."""

from __future__ import annotations

import json

import pytest

from jobs.bench_scale import main


def test_bench_scale_small(capsys):
    assert main(["--grouping-sizes", "2000,8000", "--mean-links", "5"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert [r["docs"] for r in summary["grouping"]] == [2000, 8000]
    assert all(r["groups"] < r["docs"] and r["cpu_s"] >= 0 for r in summary["grouping"])
    assert summary["grouping_6m_projection"]["docs"] == 6_000_000


@pytest.mark.parametrize("sizes", ["8000,2000", "2000", "10"])
def test_bench_scale_rejects_bad_sizes(sizes, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--grouping-sizes", sizes])
    assert exc.value.code == 2
    assert "--grouping-sizes" in capsys.readouterr().err
