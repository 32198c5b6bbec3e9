"""Hybrid retrieval over dual chunks: dense candidates, then a cross-encoder rerank to k (or "dense only").

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Section 4.1: a dual encoder recalls candidates quickly at a coarse
level, a cross-encoder scores question-chunk pairs at a fine level. The cross-encoder is any
:class:`PairScorer`; :class:`CrossEncoderScorer` loads a sentence-transformers CrossEncoder folder
(e.g. one written by ``python -m jobs.train_reranker``). Without a scorer the candidates keep their
dense order and the trace says ``"dense only"``: never silently.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from longrag.dual.chunking import DualChunk
from longrag.types import DenseEncoder

__all__ = [
    "DENSE_ONLY",
    "CROSS_ENCODER",
    "PairScorer",
    "DenseEncoder",
    "CrossEncoderScorer",
    "BiEncoderScorer",
    "load_reranker",
    "RetrievedChunk",
    "RetrievalTrace",
    "ChunkRetrieval",
    "rerank",
    "dense_top",
    "DualRetriever",
]

DENSE_ONLY = "dense only"
CROSS_ENCODER = "cross-encoder"
BI_ENCODER = "bi-encoder"


class PairScorer(Protocol):
    """Scores (query, text) pairs; higher = more relevant. ``name`` goes into traces; a scorer may
    say its ``kind`` (``"cross-encoder"``, the default, or ``"bi-encoder"``), which names the trace's mode."""

    name: str

    def score(self, query: str, texts: Sequence[str]) -> list[float]: ...


class CrossEncoderScorer:
    """A sentence-transformers ``CrossEncoder`` loaded from a local folder, on CPU unless told."""

    kind = CROSS_ENCODER

    def __init__(self, folder: str | Path, device: str = "cpu", batch_size: int = 32, max_length: int = 256):
        path = Path(folder).expanduser()
        _check_folder(path)
        from sentence_transformers import CrossEncoder

        self.model = CrossEncoder(str(path), device=device, max_length=max_length, local_files_only=True)
        self.name = str(path)
        self.batch_size = batch_size

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        scores = self.model.predict(
            [(query, t) for t in texts], batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True
        )
        return [float(s) for s in np.asarray(scores).reshape(-1)]


def _check_folder(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"reranker folder {str(path)!r} has no config.json: give a sentence-transformers cross-encoder or "
            "sentence-encoder folder (python -m jobs.train_reranker writes one) or set dual.reranker=null for dense only"
        )


class BiEncoderScorer:
    """A fine-tuned sentence-transformers encoder (``python -m jobs.train_reranker --kind bi-encoder``)
    that rescores the dense candidates by its own cosine of question and chunk."""

    kind = BI_ENCODER

    def __init__(self, folder: str | Path, device: str = "cpu", batch_size: int = 32):
        path = Path(folder).expanduser()
        _check_folder(path)
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        self.name = str(path)
        self.batch_size = batch_size

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        kw = dict(normalize_embeddings=True, show_progress_bar=False, convert_to_numpy=True)
        q = self.model.encode([query], **kw).reshape(-1)
        p = self.model.encode(list(texts), batch_size=self.batch_size, **kw)
        return [float(x) for x in p @ q]


def load_reranker(folder: str | Path, device: str = "cpu") -> CrossEncoderScorer | BiEncoderScorer:
    """The scorer a folder holds: a sentence-transformers CrossEncoder (``model_type`` CrossEncoder
    in ``config_sentence_transformers.json``, or a plain sequence-classification model) or a
    sentence encoder (a ``modules.json`` with a pooling module)."""
    import json

    path = Path(folder).expanduser()
    _check_folder(path)
    st_cfg = path / "config_sentence_transformers.json"
    model_type = json.loads(st_cfg.read_text()).get("model_type") if st_cfg.is_file() else None
    modules = path / "modules.json"
    pooled = modules.is_file() and "Pooling" in modules.read_text()
    if model_type == "CrossEncoder" or not pooled:
        return CrossEncoderScorer(path, device=device)
    return BiEncoderScorer(path, device=device)


@dataclass
class RetrievedChunk:
    """One retrieved chunk with its rank scores (``rerank_score`` is None in dense-only mode)."""

    chunk: DualChunk
    dense_score: float
    rerank_score: float | None = None

    @property
    def score(self) -> float:
        return self.dense_score if self.rerank_score is None else self.rerank_score

    def to_dict(self) -> dict[str, Any]:
        return {"chunk": self.chunk.to_dict(), "dense_score": self.dense_score, "rerank_score": self.rerank_score}


@dataclass
class RetrievalTrace:
    """How the chunks were found: ``mode`` is ``"cross-encoder"``, ``"bi-encoder"`` (a fine-tuned
    encoder rescored the dense candidates) or ``"dense only"``."""

    mode: Literal["cross-encoder", "bi-encoder", "dense only"]
    reranker: str | None
    n_chunks: int
    candidates: int
    k: int
    dense_ms: float = 0.0
    rerank_ms: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ChunkRetrieval:
    chunks: list[RetrievedChunk]
    trace: RetrievalTrace

    def to_dict(self) -> dict[str, Any]:
        return {"chunks": [c.to_dict() for c in self.chunks], "trace": self.trace.to_dict()}


def dense_top(scores: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` highest scores, best first (ties: lower index first)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    n = min(int(n), scores.size)
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.lexsort((np.arange(scores.size), -scores))[:n]


def rerank(
    question: str, candidates: Sequence[RetrievedChunk], k: int, scorer: PairScorer | None
) -> tuple[list[RetrievedChunk], str]:
    """The best ``k`` candidates by the scorer (stable for ties), or the first ``k`` in their dense
    order when ``scorer`` is None; returns them and the mode (the scorer's ``kind``, default
    ``"cross-encoder"``, or ``"dense only"``)."""
    if not isinstance(k, int) or k <= 0:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if scorer is None:
        return list(candidates[:k]), DENSE_ONLY
    scores = scorer.score(question, [c.chunk.text for c in candidates])
    if len(scores) != len(candidates):
        raise RuntimeError(f"reranker {scorer.name!r} returned {len(scores)} scores for {len(candidates)} chunks")
    scored = [RetrievedChunk(c.chunk, c.dense_score, float(s)) for c, s in zip(candidates, scores)]
    order = sorted(range(len(scored)), key=lambda i: (-scored[i].rerank_score, i))
    return [scored[i] for i in order[:k]], getattr(scorer, "kind", CROSS_ENCODER)


class DualRetriever:
    """Dense candidates over in-memory chunks, then :func:`rerank` to ``k``.

    Chunk vectors are computed once per retriever (one long document, or a question's paragraph
    pool); :meth:`retrieve` embeds the question, takes ``dense_candidates`` by cosine and reranks."""

    def __init__(
        self,
        chunks: Sequence[DualChunk],
        encoder: DenseEncoder,
        scorer: PairScorer | None = None,
        *,
        dense_candidates: int = 100,
        k: int = 7,
    ) -> None:
        if not chunks:
            raise ValueError("no chunks to retrieve from (empty document?)")
        for name, v in (("dense_candidates", dense_candidates), ("k", k)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.chunks = list(chunks)
        self.encoder = encoder
        self.scorer = scorer
        self.dense_candidates = dense_candidates
        self.k = k
        t0 = time.perf_counter()
        self.vectors = np.asarray(encoder.encode_passages([c.text for c in self.chunks]), dtype=np.float32)
        self.encode_ms = (time.perf_counter() - t0) * 1000.0
        if self.vectors.shape[0] != len(self.chunks):
            raise RuntimeError(f"encoder returned {self.vectors.shape[0]} vectors for {len(self.chunks)} chunks")

    def retrieve(self, question: str, k: int | None = None, *, scorer: Any = "configured") -> ChunkRetrieval:
        """Top ``k`` chunks (default ``self.k``) for ``question``. ``scorer`` overrides the configured
        reranker for this call (``None``: dense only), so one index can compare both orders."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question must be a non-empty str")
        k = self.k if k is None else k
        scorer = self.scorer if isinstance(scorer, str) and scorer == "configured" else scorer
        t0 = time.perf_counter()
        q = np.asarray(self.encoder.encode_queries([question]), dtype=np.float32).reshape(-1)
        scores = self.vectors @ q
        top = dense_top(scores, self.dense_candidates)
        candidates = [RetrievedChunk(self.chunks[i], float(scores[i])) for i in top]
        t1 = time.perf_counter()
        kept, mode = rerank(question, candidates, k, scorer)
        t2 = time.perf_counter()
        notes = []
        if mode == DENSE_ONLY:
            notes.append("no reranker configured (dual.reranker is null): chunks ranked by dense scores only")
        trace = RetrievalTrace(
            mode=mode,  # type: ignore[arg-type]
            reranker=None if scorer is None else scorer.name,
            n_chunks=len(self.chunks),
            candidates=len(candidates),
            k=k,
            dense_ms=(t1 - t0) * 1000.0,
            rerank_ms=(t2 - t1) * 1000.0,
            notes=notes,
        )
        return ChunkRetrieval(kept, trace)
