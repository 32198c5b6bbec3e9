"""A search request's vectors and ``k``, checked the same way by every index backend.

The Retriever's backends (the scatter/gather over shard deployments,
:class:`actors.sharded_index.ShardedIndex`, and every shard in one process,
:class:`actors.inprocess_index.InProcessIndex`) refuse a malformed request before any shard sees it,
and with the same words: which backend a deployment runs (``serve.colocate``) must not change what
a caller is told. The shards check the rest (dimension, finite values: :class:`longrag.index.maxp.MaxPIndex`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_queries", "check_query"]


def check_queries(queries: Any, k: int) -> np.ndarray:
    """A batch of query vectors as a C-contiguous float32 ``(n, dim)`` matrix, and ``k >= 1``;
    :class:`ValueError` otherwise."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if queries.ndim != 2:
        raise ValueError(f"queries must be 2-D (n, dim), got shape {queries.shape}")
    _check_k(k)
    return queries


def check_query(query: Any, k: int) -> np.ndarray:
    """One question's vector as a float32 ``(dim,)`` array, and ``k >= 1``; :class:`ValueError` otherwise."""
    query = np.asarray(query, dtype=np.float32)
    if query.ndim != 1:
        raise ValueError(f"one query vector (dim,), got shape {query.shape}")
    _check_k(k)
    return query


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
