"""Measuring tools shared by the benchmark jobs (Ray-free): latency statistics and load levels."""

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

__all__ = ["LatencyStats", "LevelResult", "Overhead", "grows_with_concurrency", "latency_stats", "machine", "median_by_key", "overhead", "run_level", "run_level_threads"]
