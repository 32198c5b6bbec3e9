"""TF-IDF links for corpora without hyperlinks (``units.links=tfidf``), the one linker of the index
job and the evaluation.

Most user corpora have no hyperlinks, so LongRAG's grouping (Algorithm 1) would leave every unit one
document. Each document links to its ``top_m`` most cosine-similar documents (similarity >=
``threshold``) by TF-IDF over ``title\\ntext``. Terms are hashed into ``n_features`` buckets
(scikit-learn's ``HashingVectorizer``: no vocabulary to gather on one machine), document
frequencies are summed over parts, and the similarities are blocked sparse products: the rows of
one part against the columns of every part, a running top-m per row. Memory per task is one part's
rows, one part's columns and a ``rows x columns`` block. The parameters come from
``units.tfidf_*`` (:class:`longrag.config.UnitConfig`).

Pure functions over arrays and scipy matrices. The index job runs them part by part on Ray
(``actors/distlinks.py``); :func:`tfidf_neighbours` runs the same steps in one process (the
evaluation's pooled corpora), row blocks standing in for parts. Title-mention links:
:mod:`longrag.index.titles`. Positions are corpus positions (``longrag.index.distplan``); a row or column
at position -1 (a dropped duplicate) takes no part.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import sparse


@dataclass(frozen=True)
class HashedTfidf:
    """TF-IDF over hashed terms: sublinear tf (1 + log tf), smooth idf (``ln((1 + n) / (1 + df)) + 1``,
    scikit-learn's ``TfidfTransformer``), rows L2-normalized, English stop words removed."""

    n_features: int = 1 << 20

    def vectorizer(self) -> Any:
        from sklearn.feature_extraction.text import HashingVectorizer

        return HashingVectorizer(n_features=self.n_features, stop_words="english", alternate_sign=False, norm=None,
                                 dtype=np.float64)

    def counts(self, texts: Sequence[str]) -> sparse.csr_matrix:
        """Raw term counts, one row per text."""
        return self.vectorizer().transform(list(texts)).tocsr()

    @staticmethod
    def doc_freq(counts: sparse.csr_matrix, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(terms, df)``: the terms of these rows (``keep``: a mask of rows that count) and in how many
        rows each occurs: the sparse part of the corpus' document frequencies."""
        rows = counts if keep is None else counts[np.flatnonzero(keep)]
        df = np.bincount(rows.indices, minlength=counts.shape[1])
        terms = np.flatnonzero(df)
        return terms.astype(np.int64), df[terms].astype(np.int64)

    @staticmethod
    def idf(df: np.ndarray, n_docs: int) -> np.ndarray:
        return np.log((1.0 + n_docs) / (1.0 + df.astype(np.float64))) + 1.0

    @staticmethod
    def weigh(counts: sparse.csr_matrix, idf: np.ndarray) -> sparse.csr_matrix:
        """L2-normalized sublinear-tf x idf rows (an all-stop-word text stays an empty row)."""
        x = counts.astype(np.float64, copy=True)
        x.data = (1.0 + np.log(x.data)) * idf[x.indices]
        norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
        norms[norms == 0] = 1.0
        return sparse.csr_matrix(sparse.diags(1.0 / norms) @ x)


def _keep_best(row: np.ndarray, sim: np.ndarray, pos: np.ndarray, m: int) -> tuple[np.ndarray, ...]:
    """Of ``(row, sim, pos)`` triples, the ``m`` best per row: highest similarity first, ties by lower
    position; returned sorted by row, then rank."""
    order = np.lexsort((pos, -sim, row))
    row, sim, pos = row[order], sim[order], pos[order]
    starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]]) if row.size else np.zeros(0, np.int64)
    rank = np.arange(row.size) - np.repeat(starts, np.diff(np.r_[starts, row.size]))
    keep = rank < m
    return row[keep], sim[keep], pos[keep]


def topm_neighbours(rows: sparse.csr_matrix, row_pos: np.ndarray,
                    column_blocks: Iterable[tuple[sparse.csr_matrix, np.ndarray]], *,
                    top_m: int, threshold: float) -> list[np.ndarray]:
    """For each row, the positions of its ``top_m`` most similar columns over all ``column_blocks``
    (``(matrix, positions)`` pairs) with similarity >= ``threshold`` (> 0: documents that share no
    term are never neighbours), itself and columns at position -1 excluded; best first, ties by
    position. Rows at position -1 get no neighbours. Only the products' nonzeros are looked at: a
    block's cost is its sparse product, its memory the pairs that share a term."""
    if top_m < 1:
        raise ValueError(f"top_m must be >= 1, got {top_m}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    row_pos = np.asarray(row_pos, dtype=np.int64)
    rows_t = rows.astype(np.float64)
    best = (np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.int64))
    for cols, col_pos in column_blocks:
        col_pos = np.asarray(col_pos, dtype=np.int64)
        if cols.shape[0] == 0 or rows.shape[0] == 0:
            continue
        prod = (rows_t @ cols.astype(np.float64).T).tocoo()
        pos = col_pos[prod.col]
        keep = (prod.data >= threshold - 1e-9) & (pos >= 0) & (pos != row_pos[prod.row]) & (row_pos[prod.row] >= 0)
        best = _keep_best(np.r_[best[0], prod.row[keep].astype(np.int64)], np.r_[best[1], prod.data[keep]],
                          np.r_[best[2], pos[keep]], top_m)
    row, _, pos = best
    bounds = np.searchsorted(row, np.arange(rows.shape[0] + 1))
    return [pos[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def edges_from_neighbours(row_pos: np.ndarray, neighbours: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` position arrays of per-row neighbour lists."""
    src = np.repeat(np.asarray(row_pos, dtype=np.int64), [len(x) for x in neighbours])
    dst = np.concatenate([np.asarray(x, dtype=np.int64) for x in neighbours]) if neighbours else np.zeros(0, np.int64)
    return src, dst


def tfidf_neighbours(texts: Sequence[str], *, top_m: int, threshold: float, n_features: int,
                     block_size: int = 1024) -> list[list[int]]:
    """Each text's ``top_m`` most similar other texts (indices, best first, ties by index) with
    similarity >= ``threshold``, in one process: the counts, document frequencies, weights and
    running top-m the index job computes part by part, blocks of ``block_size`` rows as the parts."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    tf = HashedTfidf(n_features)
    counts = tf.counts(texts)
    n = counts.shape[0]
    if n == 0:
        return []
    df = np.zeros(n_features, dtype=np.int64)
    terms, freq = tf.doc_freq(counts)
    df[terms] = freq
    x = tf.weigh(counts, tf.idf(df, n))
    pos = np.arange(n, dtype=np.int64)
    blocks = [(x[a:a + block_size], pos[a:a + block_size]) for a in range(0, n, block_size)]
    out: list[list[int]] = []
    for rows, row_pos in blocks:
        out.extend(near.tolist() for near in topm_neighbours(rows, row_pos, blocks, top_m=top_m, threshold=threshold))
    return out
