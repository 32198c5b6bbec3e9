"""Synthetic stand-ins for real embeddings and builds, at sizes a CPU machine cannot embed:
:func:`clustered_vectors` makes unit-normalised vectors around random topic centres, with chunks of
a unit near each other (a unit is about one subject), and queries near random chunks, seeded and
reproducible; :func:`write_synthetic_build` writes a complete build of Flat shards over such
vectors with generated chunk text, as the memory model's shard actors load.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from longrag.index.maxp import MaxPIndex


def clustered_vectors(
    n_chunks: int,
    dim: int,
    *,
    chunks_per_unit: int = 8,
    n_topics: int = 1000,
    unit_spread: float = 0.6,
    chunk_spread: float = 0.35,
    n_queries: int = 200,
    query_spread: float = 0.35,
    seed: int = 0,
) -> tuple[np.ndarray, list[str], list[str], np.ndarray]:
    """``(vectors float32 (n, dim), chunk_ids, unit_ids, queries float32 (q, dim))``, all rows unit norm.

    Each unit sits near a topic centre (``unit_spread``), each chunk near its unit
    (``chunk_spread``), each query near a random chunk (``query_spread``); spreads are the norm of
    the Gaussian noise relative to the unit-norm point it perturbs."""
    if n_chunks < 1 or dim < 2 or chunks_per_unit < 1 or n_topics < 1 or n_queries < 0:
        raise ValueError("n_chunks, dim (>= 2), chunks_per_unit, n_topics must be positive; n_queries >= 0")
    rng = np.random.default_rng(seed)

    def normed(x: np.ndarray) -> np.ndarray:
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def noise(rows: int, spread: float) -> np.ndarray:
        return rng.standard_normal((rows, dim)).astype(np.float32) * (spread / math.sqrt(dim))

    n_units = -(-n_chunks // chunks_per_unit)
    topics = normed(rng.standard_normal((n_topics, dim)).astype(np.float32))
    units = normed(topics[rng.integers(0, n_topics, n_units)] + noise(n_units, unit_spread))
    unit_of_chunk = np.repeat(np.arange(n_units), chunks_per_unit)[:n_chunks]
    vectors = np.empty((n_chunks, dim), dtype=np.float32)
    step = 65536  # bounded temporaries at millions of rows
    for lo in range(0, n_chunks, step):
        hi = min(n_chunks, lo + step)
        vectors[lo:hi] = normed(units[unit_of_chunk[lo:hi]] + noise(hi - lo, chunk_spread))
    queries = np.zeros((0, dim), dtype=np.float32)
    if n_queries:
        queries = normed(vectors[rng.integers(0, n_chunks, n_queries)] + noise(n_queries, query_spread))
    width = len(str(n_units))
    unit_ids = [f"u{u:0{width}d}" for u in unit_of_chunk.tolist()]
    chunk_ids = [f"c{i}" for i in range(n_chunks)]
    return vectors, chunk_ids, unit_ids, queries


def synthetic_shard(n: int, dim: int, chunk_chars: int, chunks_per_unit: int, seed: int, shard_id: int,
                    offset: int) -> tuple[np.ndarray, list[Any], list[Any]]:
    """One synthetic shard of :func:`write_synthetic_build`: ``(vectors, chunks, units)``."""
    from longrag.text.tokens import chars_estimate
    from longrag.types import Chunk, Unit

    vectors, _, local_units, _ = clustered_vectors(n, dim, chunks_per_unit=chunks_per_unit, n_queries=0,
                                                   seed=seed + shard_id)
    rng = np.random.default_rng(seed + 10_000 + shard_id)
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"])
    n_words = max(1, chunk_chars // 7)
    chunks: list[Chunk] = []
    for i in range(n):
        text = " ".join(words[rng.integers(0, len(words), n_words)].tolist())[:chunk_chars]
        chunks.append(Chunk(chunk_id=f"c{offset + i}", unit_id=f"s{shard_id}-{local_units[i]}",
                            position=i % chunks_per_unit, text=text, n_tokens=chars_estimate(text)))
    by_unit: dict[str, list[Chunk]] = {}
    for c in chunks:
        by_unit.setdefault(c.unit_id, []).append(c)
    units = [Unit(unit_id=u, doc_ids=[u], titles=[u], text=" ".join(c.text for c in cs),
                  n_tokens=sum(c.n_tokens for c in cs)) for u, cs in by_unit.items()]
    return vectors, chunks, units


def write_synthetic_build(root: str, sizes: list[int], dim: int, chunk_chars: int, chunks_per_unit: int,
                          seed: int) -> None:
    """A complete build of ``len(sizes)`` Flat shards of synthetic chunks (text of ``chunk_chars``)."""
    from longrag.config import LongRAGConfig
    from longrag.index.artifacts import ArtifactStore, write_shard
    from longrag.index.manifest import Manifest

    store = ArtifactStore.open(root)
    manifest = Manifest.create(LongRAGConfig(), dim=dim, documents=0, argv=["jobs.bench", "index"])
    offset = 0
    for shard_id, n in enumerate(sizes):
        vectors, chunks, units = synthetic_shard(n, dim, chunk_chars, chunks_per_unit, seed, shard_id, offset)
        index = MaxPIndex.build(vectors, [c.chunk_id for c in chunks], [c.unit_id for c in chunks])
        manifest.add_shard(write_shard(store, shard_id, units, chunks, index))
        offset += n
    manifest.mark_complete()
    store.write_manifest(manifest)
