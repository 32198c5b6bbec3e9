"""The paper's two nearest-neighbour baselines (Alonso and Millidge, 2024,
"Mixture-of-PageRanks: Replacing Long-Context with Real-Time, Sparse GraphRAG", Appendix A.2), over
the same chunks and query definition as MixPR, results in document order.

* RAG-Sparse: cosine of L2-normalised TF-IDF vectors, ``s = E q`` (sparse matrix-vector product).
* RAG-Hybrid: ``0.15 * s_sparse + 0.85 * s_dense``; dense cosine from an embedding model (the
  bundled all-MiniLM-L6-v2 by default, the paper used a 435M Alibaba GTE model) searched with a
  FAISS flat inner-product index over every chunk.

The query vector is the TF-IDF (or dense embedding) of the query text: the appended question, or
the document's last chunk(s) (see :mod:`longrag.mixpr.retriever`).
"""

from __future__ import annotations

import time

import numpy as np

from longrag.mixpr.config import MixPRConfig
from longrag.mixpr.retriever import MixPRResult, PreparedDocument, _to_chunks, prepare_document, top_k_in_order
from longrag.types import DenseEncoder

__all__ = ["SparseRetriever", "HybridRetriever", "sparse_scores", "DenseEncoder"]


def sparse_scores(prep: PreparedDocument) -> np.ndarray:
    """TF-IDF cosine of every chunk with the query text, float64 (n_chunks,)."""
    emb = prep.embedding
    if len(prep.chunks) == 0:
        return np.zeros(0)
    q = emb.transform([prep.query_text])
    per_distinct = np.asarray((emb.matrix @ q.T).todense(), dtype=np.float64).ravel()
    return per_distinct[emb.classes]


def _result(prep: PreparedDocument, scores: np.ndarray, k: int, route: str, timings: dict) -> MixPRResult:
    t0 = time.perf_counter()
    pos = top_k_in_order(scores, k, prep.n_doc)
    chunks = _to_chunks(prep, pos, scores)
    timings["topk"] = time.perf_counter() - t0
    timings["total"] = sum(v for key, v in timings.items() if key != "total")
    return MixPRResult(
        chunks=chunks, route=route, alpha=float("nan"), n_chunks=prep.n_doc,
        n_distinct=int(prep.embedding.matrix.shape[0]), n_edges=0, iterations=0, converged=True, timings=timings,
    )  # fmt: skip


class SparseRetriever:
    """RAG-Sparse: top-k chunks by TF-IDF cosine to the query, in document order."""

    name = "rag-sparse"

    def __init__(self, config: MixPRConfig | None = None):
        self.config = config or MixPRConfig()

    def rank(self, prep: PreparedDocument) -> MixPRResult:
        timings = dict(prep.timings)
        t0 = time.perf_counter()
        s = sparse_scores(prep)
        timings["score"] = time.perf_counter() - t0
        return _result(prep, s, self.config.top_k, "sparse", timings)

    def retrieve_with_trace(self, document: str, question: str | None = None) -> MixPRResult:
        return self.rank(prepare_document(document, question, self.config))

    def retrieve(self, document: str, question: str | None = None):
        return self.retrieve_with_trace(document, question).chunks


class HybridRetriever:
    """RAG-Hybrid: ``w_s * TF-IDF cosine + w_d * dense cosine`` (0.15 / 0.85), FAISS flat IP index
    for the dense part. ``encoder`` is a :class:`longrag.index.embedding.Embedder` (or anything with
    ``encode_passages``/``encode_queries`` returning L2-normalised float32 rows)."""

    name = "rag-hybrid"

    def __init__(self, encoder: DenseEncoder, config: MixPRConfig | None = None):
        self.encoder = encoder
        self.config = config or MixPRConfig()

    def dense_scores(self, prep: PreparedDocument) -> np.ndarray:
        """Dense cosine of every chunk with the query text, float64 (n_chunks,); each distinct
        chunk text is embedded once."""
        import faiss

        emb = prep.embedding
        n_distinct = int(emb.matrix.shape[0])
        if n_distinct == 0:
            return np.zeros(0)
        # distinct texts in class order (first occurrence of each class)
        first = np.full(n_distinct, -1, dtype=np.int64)
        order = np.arange(emb.classes.size - 1, -1, -1)
        first[emb.classes[order]] = order
        texts = [prep.chunks.texts[i] for i in first]
        X = np.ascontiguousarray(self.encoder.encode_passages(texts), dtype=np.float32)
        if X.ndim != 2 or X.shape[0] != n_distinct:
            raise ValueError(f"encoder returned shape {X.shape}, expected ({n_distinct}, dim)")
        q = np.ascontiguousarray(self.encoder.encode_queries([prep.query_text]), dtype=np.float32)
        if q.shape != (1, X.shape[1]):
            raise ValueError(f"query embedding has shape {q.shape}, expected (1, {X.shape[1]})")
        index = faiss.IndexFlatIP(X.shape[1])
        index.add(X)
        D, I = index.search(q, n_distinct)  # noqa: E741 - FAISS's own names (distances, ids)
        dense = np.zeros(n_distinct)
        valid = I[0] >= 0
        dense[I[0][valid]] = D[0][valid]
        return dense[emb.classes]

    def rank(self, prep: PreparedDocument) -> MixPRResult:
        cfg = self.config
        timings = dict(prep.timings)
        t0 = time.perf_counter()
        s_sparse = sparse_scores(prep)
        t1 = time.perf_counter()
        s_dense = self.dense_scores(prep)
        t2 = time.perf_counter()
        timings.update(score=t1 - t0, dense=t2 - t1)
        s = cfg.hybrid_sparse_weight * s_sparse + cfg.hybrid_dense_weight * s_dense
        return _result(prep, s, cfg.top_k, "hybrid", timings)

    def retrieve_with_trace(self, document: str, question: str | None = None) -> MixPRResult:
        return self.rank(prepare_document(document, question, self.config))

    def retrieve(self, document: str, question: str | None = None):
        return self.retrieve_with_trace(document, question).chunks
