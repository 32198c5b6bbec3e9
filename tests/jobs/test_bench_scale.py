"""The scale benchmark runs end to end on small sizes and ends with its JSON line (no Ray)."""

from __future__ import annotations

import json

import pytest

from lab.bench.cli.scale import main

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)


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


@pytest.mark.scenario
def test_bench_scale_driver_memory_and_embedding(capsys):
    """The driver-memory run plans a generated corpus with the distributed build in a fresh driver
    process, and the embedding comparison encodes the same chunks raw and through the Ray Data pool
    (same vectors)."""
    assert main(["--grouping-sizes", "2000,4000", "--driver-memory-sizes", "2000", "--embed-chunks", "64",
                 "--embed-pools", "auto,1x2", "--cpus", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    [run] = summary["driver_memory"]
    assert run["docs"] == 2000 and 0 < run["units"] < 2000 and run["unit_text_mb"] > 0
    assert run["driver_peak_mb"] >= run["driver_base_mb"]
    pools = {p["pool"]: p for p in summary["embedding"]["pools"]}
    assert pools["auto"]["actors"] == 2 and pools["auto"]["torch_threads"] == 1  # a thread per core
    assert pools["1x2"]["actors"] == 1 and pools["1x2"]["torch_threads"] == 2
    assert all(p["max_abs_vector_diff"] < 1e-4 for p in pools.values())
    assert summary["embedding_ray_over_raw_ratio"] == pools["auto"]["ratio_steady"] > 0


@pytest.mark.parametrize("pools", ["2y1", "auto,0x1", ""])
def test_bench_scale_rejects_bad_pools(pools, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--embed-pools", pools])
    assert exc.value.code == 2
    assert "--embed-pools" in capsys.readouterr().err
