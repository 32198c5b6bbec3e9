"""The one check of a search request's vectors and ``k`` (:mod:`longrag.index.queries`), which both
index backends of the Retriever run before any shard sees the request."""

from __future__ import annotations

import numpy as np
import pytest

from longrag.index.queries import check_queries, check_query


def test_a_batch_becomes_a_contiguous_float32_matrix():
    batch = np.arange(12, dtype=np.float64).reshape(4, 3)[:, ::2]  # float64, not contiguous
    out = check_queries(batch, 1)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == (4, 2)
    assert np.array_equal(out, batch.astype(np.float32))
    assert check_queries([[0.5, 1.0]], 3).shape == (1, 2)  # lists too
    ready = np.ones((2, 3), dtype=np.float32)
    assert check_queries(ready, 2) is ready  # nothing copied when nothing needs to be


def test_one_query_becomes_a_float32_vector():
    out = check_query([1, 2, 3], 5)
    assert out.dtype == np.float32 and out.shape == (3,)


@pytest.mark.parametrize("queries, k, message", [
    (np.ones(3), 1, r"queries must be 2-D \(n, dim\), got shape \(3,\)"),
    (np.ones((1, 2, 3)), 1, r"queries must be 2-D \(n, dim\), got shape \(1, 2, 3\)"),
    (np.ones((2, 3)), 0, "k must be >= 1, got 0"),
])
def test_a_malformed_batch_is_refused(queries, k, message):
    with pytest.raises(ValueError, match=message):
        check_queries(queries, k)


@pytest.mark.parametrize("query, k, message", [
    (np.ones((1, 3)), 1, r"one query vector \(dim,\), got shape \(1, 3\)"),
    (np.ones(3), -2, "k must be >= 1, got -2"),
])
def test_a_malformed_query_is_refused(query, k, message):
    with pytest.raises(ValueError, match=message):
        check_query(query, k)
