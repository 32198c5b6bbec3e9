"""Measuring tools shared by the benchmarks (Ray-free): latency statistics and load levels; the benchmarks
themselves, one CLI each behind ``longrag bench <name>``, are in :mod:`lab.bench.cli`."""

from lab.bench.load import (
    LatencyStats,
    LevelResult,
    Overhead,
    grows_with_concurrency,
    latency_stats,
    machine,
    median_by_key,
    overhead,
    run_level,
    run_level_threads,
)

__all__ = ["LatencyStats", "LevelResult", "Overhead", "grows_with_concurrency", "latency_stats", "machine",
           "median_by_key", "overhead", "run_level", "run_level_threads"]
