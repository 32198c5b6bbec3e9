"""Dual-perspective LongRAG over one request's text: a long document or retrieved paragraphs -> chunks ->
dense (+ rerank) -> a strategy. One definition for ``jobs.longcontext --strategy`` and the Serve app.

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Sections 4.1-4.4 and 5.3. The stages run wherever the
:class:`~longrag.dual.pipeline.DualPipeline` puts them (in process, or remote deployments); chunk
encoding is CPU work and runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from longrag.config import DualConfig
from longrag.dual.chunking import SourceParagraph
from longrag.dual.paragraphs import ChunkIndex, index_document, index_paragraphs
from longrag.dual.pipeline import DualPipeline, check_strategy
from longrag.dual.records import DualResult
from longrag.dual.rerank import ChunkRetrieval, DenseEncoder, PairScorer

__all__ = ["DualAnswer", "DualService"]

#: DualResult fields copied into an answer's JSON (the rest is in the trace).
_RESULT_KEYS = ("answer", "kept_chunk_ids", "global_information", "cot", "judgements")


@dataclass
class DualAnswer:
    """What one request gets: the strategy, the retrieved chunks, and (unless retrieve-only) the result."""

    strategy: str
    retrieval: ChunkRetrieval
    n_paragraphs: int
    index_ms: float
    result: DualResult | None = None

    @property
    def answer(self) -> str | None:
        return None if self.result is None else self.result.answer

    def to_dict(self) -> dict[str, Any]:
        """``{strategy, chunks: [{position, paragraph_id, text, score}], answer?, kept_chunk_ids?,
        global_information?, cot?, judgements?, trace}``: the trace has the retrieval, every stage's
        model, calls, tokens and latency, the generator's input tokens and the notes."""
        out: dict[str, Any] = {
            "strategy": self.strategy,
            "chunks": [
                {"position": c.chunk.chunk_id, "paragraph_id": c.chunk.paragraph_id, "text": c.chunk.text,
                 "score": c.score}  # fmt: skip
                for c in self.retrieval.chunks
            ],
        }
        if self.result is None:
            out["trace"] = {"retrieval": self.retrieval.trace.to_dict(), "n_paragraphs": self.n_paragraphs,
                            "index_ms": self.index_ms}  # fmt: skip
            return out
        d = self.result.to_dict()
        out.update({k: d[k] for k in _RESULT_KEYS})
        out["trace"] = {**d["trace"], "n_paragraphs": self.n_paragraphs, "index_ms": self.index_ms}
        return out


class DualService:
    """Indexes a request's text and answers with a strategy (default ``config.strategy``)."""

    def __init__(self, pipeline: DualPipeline, encoder: DenseEncoder, scorer: PairScorer | None, config: DualConfig):
        self.pipeline = pipeline
        self.encoder = encoder
        self.scorer = scorer
        self.config = config

    def _config(self, k: int | None) -> DualConfig:
        if k is None:
            return self.config
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        return self.config.model_copy(update={"rerank_k": k})

    async def _answer(self, build, question: str, strategy: str | None, retrieve_only: bool) -> DualAnswer:
        strategy = check_strategy(strategy or self.config.strategy)
        if not isinstance(question, str) or not question.strip():
            raise ValueError("the dual pipeline needs a question (a non-empty string)")
        t0 = time.perf_counter()
        index: ChunkIndex = await asyncio.to_thread(build)
        retrieval = await asyncio.to_thread(index.retriever.retrieve, question)
        out = DualAnswer(strategy, retrieval, len(index.paragraphs), round((time.perf_counter() - t0) * 1e3, 2))
        if not retrieve_only:
            out.result = await self.pipeline.run(question, retrieval, index.paragraphs, strategy)
        return out

    async def over_document(
        self, document: str, question: str, strategy: str | None = None, k: int | None = None,
        retrieve_only: bool = False,
    ) -> DualAnswer:  # fmt: skip
        """One long document (the LongBench setting): blank-line paragraphs, sentence chunks."""
        cfg = self._config(k)
        return await self._answer(lambda: index_document(document, self.encoder, self.scorer, cfg), question,
                                  strategy, retrieve_only)  # fmt: skip

    async def over_paragraphs(
        self, paragraphs: Sequence[SourceParagraph], question: str, strategy: str | None = None,
        k: int | None = None, retrieve_only: bool = False,
    ) -> DualAnswer:  # fmt: skip
        """Given paragraphs (e.g. the units an index retrieved): sentence chunks of each."""
        if not paragraphs:
            raise ValueError("no paragraphs to answer from")
        cfg = self._config(k)
        return await self._answer(lambda: index_paragraphs(list(paragraphs), self.encoder, self.scorer, cfg), question,
                                  strategy, retrieve_only)  # fmt: skip
