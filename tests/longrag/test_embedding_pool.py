"""The Ray Data embedding pool is sized from the resources the cluster offers (issue 13, section 2:
one actor holding one torch thread left a 2-core machine half idle); config fields override it."""

from __future__ import annotations

import pytest

from longrag.config import EmbeddingConfig
from longrag.index.embedding import FEEDER_CPUS, embedding_pool


def test_cpu_pool_runs_a_torch_thread_per_core():
    pool = embedding_pool(EmbeddingConfig(), cpus=2)
    assert (pool.actors, pool.torch_threads, pool.num_gpus) == (2, 1, 0.0)
    assert pool.actors * pool.num_cpus == pytest.approx(2 - FEEDER_CPUS)  # the feeding stages still fit
    assert embedding_pool(EmbeddingConfig(), cpus=16).actors == 16


def test_config_overrides_the_sizing():
    pool = embedding_pool(EmbeddingConfig(concurrency=1, torch_threads=2), cpus=2)
    assert (pool.actors, pool.torch_threads) == (1, 2) and pool.num_cpus == pytest.approx(2 - FEEDER_CPUS)
    pool = embedding_pool(EmbeddingConfig(torch_threads=4), cpus=16)
    assert (pool.actors, pool.torch_threads) == (4, 4) and pool.num_cpus == pytest.approx((16 - FEEDER_CPUS) / 4, abs=1e-3)
    assert embedding_pool(EmbeddingConfig(num_cpus=0.5, concurrency=3), cpus=8).num_cpus == 0.5


def test_gpu_pool_takes_one_actor_per_gpu_share():
    pool = embedding_pool(EmbeddingConfig(num_gpus=0.5), cpus=32, gpus=4)
    assert (pool.actors, pool.num_gpus, pool.num_cpus, pool.torch_threads) == (8, 0.5, 1.0, 1)


def test_the_chunkers_grow_with_the_pool_they_feed():
    """Issue 40, item 6: one chunker re-tokenizes ~2,000 chunks/s; a CPU embedding actor encodes tens, a GPU one
    thousands (longrag.index.embedding.chunker_actors)."""
    from longrag.index.embedding import chunker_actors

    assert chunker_actors(embedding_pool(EmbeddingConfig(), cpus=2)) == 1
    assert chunker_actors(embedding_pool(EmbeddingConfig(), cpus=64)) == 1
    assert chunker_actors(embedding_pool(EmbeddingConfig(), cpus=200)) == 4
    assert chunker_actors(embedding_pool(EmbeddingConfig(num_gpus=1.0), cpus=64, gpus=8)) == 8
