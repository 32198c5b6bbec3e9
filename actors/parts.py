"""The ``documents/`` parts of a distributed build, as the Ray stages read them: one part's columns,
its rows' corpus positions, a Ray Data actor pool over the parts, and the ``(src, dst)`` edge arrays
such a pool returns. Shared by the build (:mod:`actors.distbuild`) and the computed links
(:mod:`actors.distlinks`); a leaf: it imports neither."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from longrag.index.grouping import index_dtype


def row_keys(part: np.ndarray, row: np.ndarray) -> np.ndarray:
    """One int64 key per ``(part, row)``: the part's code (task * 65536 + part of the task) * 65536 + row."""
    return np.asarray(part, dtype=np.int64) * 65536 + np.asarray(row, dtype=np.int64)


def read_part(store: Any, key: str, columns: list[str]) -> Any:
    """Columns of one ``documents/`` parquet part of the build."""

    return store.storage.read_table(str(key), columns)


def part_positions(keys_sorted: np.ndarray, pos_sorted: np.ndarray, code: int, n_rows: int) -> np.ndarray:
    """Corpus positions of a part's rows (-1: a dropped duplicate), from the sorted ``(part, row)`` keys."""
    return pos_sorted[np.searchsorted(keys_sorted, row_keys(np.full(n_rows, code), np.arange(n_rows)))]


def over_parts(parts: list[tuple[str, int]], fn: type, **kwargs: Any) -> Any:
    """A Ray Data pool of the callable class ``fn`` (built with ``kwargs``) over the build's
    ``documents/`` parts, one part per batch, at most one actor per CPU the cluster can grow to."""
    from actors.embedding import cluster_capacity

    cpus = max(1, int(cluster_capacity()[0].get("CPU", 1)))
    ds = ray.data.from_items([{"key": k, "code": c} for k, c in parts], override_num_blocks=len(parts))
    return ds.map_batches(fn, batch_size=1, fn_constructor_kwargs=kwargs, concurrency=min(cpus, len(parts)), num_cpus=1)


def collect_edges(ds: Any, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """A dataset's ``(src, dst)`` batches as two position arrays of :func:`index_dtype`, converted
    batch by batch."""
    dtype = index_dtype(n_docs)
    src, dst = [], []
    for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
        src.append(b["src"].astype(dtype))
        dst.append(b["dst"].astype(dtype))
    return (np.concatenate(src) if src else np.zeros(0, dtype)), (np.concatenate(dst) if dst else np.zeros(0, dtype))
