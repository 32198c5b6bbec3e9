"""Sparse TF-IDF chunk embeddings, L2-normalised rows, kept as scipy CSR float32.

Long documents repeat chunks (RULER's noise haystack repeats five sentences thousands of times;
HashHop and list-like text repeat lines). Identical chunks have identical embeddings, so the
embedding is computed once per DISTINCT chunk text: ``matrix`` has one row per distinct text and
``classes[i]`` names the row of chunk ``i``. The weights are exactly scikit-learn's
``TfidfVectorizer`` on the full chunk list (smooth idf ``ln((1+n)/(1+df)) + 1`` with ``n`` and ``df``
counted over all chunks, duplicates included, then L2 row normalisation): counting is done by
scikit-learn's ``CountVectorizer`` on the distinct texts, document frequencies are weighted by
multiplicity. A test checks equality with ``TfidfVectorizer``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import CountVectorizer

from longrag.mixpr.config import MixPRConfig

__all__ = ["TfidfEmbedding", "embed_tfidf", "distinct"]


def distinct(texts: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(unique_texts, classes, counts)``: unique texts in first-seen order, ``classes[i]`` the
    index of ``texts[i]`` among them (int64 (n,)), ``counts[c]`` how often text ``c`` occurs."""
    ids: dict[str, int] = {}
    classes = np.fromiter((ids.setdefault(t, len(ids)) for t in texts), dtype=np.int64, count=len(texts))
    counts = np.bincount(classes, minlength=len(ids)).astype(np.int64)
    return list(ids), classes, counts


class TfidfEmbedding:
    """TF-IDF of a chunk list, stored per distinct chunk text.

    matrix: CSR float32 (n_distinct, n_terms), rows L2-normalised (zero row: no term).
    classes: int64 (n_chunks,), row of ``matrix`` for each chunk. counts: int64 (n_distinct,).
    """

    def __init__(
        self,
        matrix: sp.csr_matrix,
        classes: np.ndarray,
        counts: np.ndarray,
        counter: CountVectorizer | None,
        idf: np.ndarray | None,
        sublinear_tf: bool = False,
    ):
        self.matrix = matrix
        self.classes = classes
        self.counts = counts
        self.counter = counter
        self.idf = idf
        self.sublinear_tf = sublinear_tf

    @property
    def n_chunks(self) -> int:
        return int(self.classes.shape[0])

    @property
    def n_terms(self) -> int:
        return int(self.matrix.shape[1])

    def chunk_matrix(self) -> sp.csr_matrix:
        """One row per chunk (n_chunks, n_terms), duplicates expanded (for references and tests)."""
        return self.matrix[self.classes]

    def transform(self, texts: Sequence[str]) -> sp.csr_matrix:
        """CSR float32 (len(texts), n_terms), L2-normalised rows; unknown words are ignored."""
        if isinstance(texts, str):
            raise ValueError("texts must be a sequence of str, got a single str")
        texts = list(texts)
        if self.counter is None:
            return sp.csr_matrix((len(texts), 0), dtype=np.float32)
        return _weight(self.counter.transform(texts), self.idf, self.sublinear_tf)


def _weight(counts: sp.spmatrix, idf: np.ndarray, sublinear: bool) -> sp.csr_matrix:
    m = sp.csr_matrix(counts, dtype=np.float64)
    if sublinear:
        np.log(m.data, out=m.data)
        m.data += 1.0
    m.data *= idf[m.indices]
    sq = np.asarray(m.multiply(m).sum(axis=1)).ravel()
    norms = np.sqrt(sq)
    norms[norms == 0] = 1.0
    m.data /= np.repeat(norms, np.diff(m.indptr))
    out = m.astype(np.float32)
    out.sort_indices()
    return out


def embed_tfidf(texts: Sequence[str], config: MixPRConfig | None = None) -> TfidfEmbedding:
    """TF-IDF embeddings of ``texts`` (the chunks), computed once per distinct text. Text without
    any term (empty, punctuation, only stop words) gets a zero row, never an error."""
    cfg = config or MixPRConfig()
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of str, got a single str")
    texts = list(texts)
    uniq, classes, counts = distinct(texts)
    n = len(texts)
    if n == 0:
        return TfidfEmbedding(sp.csr_matrix((0, 0), dtype=np.float32), classes, counts, None, None)
    counter = CountVectorizer(
        lowercase=cfg.lowercase,
        token_pattern=cfg.token_pattern,
        stop_words=cfg.stop_words,
        dtype=np.float64,
    )
    try:
        tf = counter.fit_transform(uniq).tocsr()
    except ValueError as exc:  # "empty vocabulary": no chunk has a term
        if "empty vocabulary" not in str(exc):
            raise
        return TfidfEmbedding(sp.csr_matrix((len(uniq), 0), dtype=np.float32), classes, counts, None, None)
    # document frequency over ALL chunks: each distinct text counts as often as it occurs
    df = np.bincount(tf.indices, weights=np.repeat(counts, np.diff(tf.indptr)).astype(np.float64), minlength=tf.shape[1])
    idf = np.log((1.0 + n) / (1.0 + df)) + 1.0
    return TfidfEmbedding(_weight(tf, idf, cfg.sublinear_tf), classes, counts, counter, idf, cfg.sublinear_tf)
