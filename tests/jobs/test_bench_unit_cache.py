"""``jobs.bench unit-cache``'s workload (the real readers run in the bench itself, docs/benchmarks.md)."""

from __future__ import annotations

import numpy as np
from scipy import stats

from lab.bench.cli.unit_cache import TEMPLATES, workload, zipf_ranks
from longrag.types import Unit


def test_ranks_follow_the_zipf_popularity():
    """Against scipy's truncated Zipf (zipfian) as the reference distribution."""
    n, s = 40, 1.1
    ranks = zipf_ranks(40_000, n, s, seed=3)
    freq = np.bincount(ranks, minlength=n) / len(ranks)
    np.testing.assert_allclose(freq, stats.zipfian(s, n).pmf(np.arange(1, n + 1)), atol=0.01)
    assert zipf_ranks(50, n, s, seed=3) == zipf_ranks(50, n, s, seed=3)


def test_only_the_top_unit_repeats_and_questions_name_its_title():
    units = [Unit(f"u{i}", [f"d{i}"], [f"Title {i}"], "text", 5) for i in range(10)]
    requests = workload(units, 200, 1.1, seed=0)
    tops = [r[1][0].unit_id for r in requests]
    assert tops.count("u0") > 3 * tops.count("u9")  # rank 1 is 10 ** 1.1 = 12.6 times as likely as rank 10
    for i, (question, (top, other)) in enumerate(requests):
        assert other.unit_id != top.unit_id
        assert question == TEMPLATES[i % len(TEMPLATES)].format(t=top.titles[0])
