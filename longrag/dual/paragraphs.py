"""The paragraphs a dual-perspective question is answered from: a corpus's (or one long document's)
source paragraphs chunked and indexed for retrieval (:class:`ChunkIndex`), and the mapping of
retrieved chunks back to their source paragraphs (Section 4.2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from longrag.config import DualConfig
from longrag.dual.chunking import DualChunk, SourceParagraph, chunk_paragraphs, split_document
from longrag.dual.rerank import DenseEncoder, DualRetriever, PairScorer, RetrievedChunk


@dataclass
class ChunkIndex:
    """Chunks of a corpus with their source paragraphs and a retriever over them."""

    paragraphs: dict[str, SourceParagraph]
    chunks: list[DualChunk]
    retriever: DualRetriever


def map_to_paragraphs(
    chunks: Sequence[RetrievedChunk], paragraphs: Mapping[str, SourceParagraph]
) -> list[tuple[SourceParagraph, RetrievedChunk]]:
    """Each distinct source paragraph of ``chunks`` once, with its best-scored chunk, best first
    (Section 4.2's mapping: k chunks -> k' <= k paragraphs). Unknown paragraph ids raise."""
    best: dict[str, RetrievedChunk] = {}
    for c in chunks:
        pid = c.chunk.paragraph_id
        if pid not in paragraphs:
            raise KeyError(f"chunk {c.chunk.chunk_id} maps to unknown paragraph {pid!r}")
        if pid not in best or c.score > best[pid].score:
            best[pid] = c
    order = sorted(best, key=lambda pid: -best[pid].score)
    return [(paragraphs[pid], best[pid]) for pid in order]


def index_paragraphs(
    paragraphs: Sequence[SourceParagraph], encoder: DenseEncoder, scorer: PairScorer | None, cfg: DualConfig
) -> ChunkIndex:
    """Chunk ``paragraphs`` with ``cfg`` and build a :class:`DualRetriever` over them."""
    chunks = chunk_paragraphs(paragraphs, cfg.chunk_words, cfg.overlap_sentences, cfg.min_tail_words)
    retriever = DualRetriever(chunks, encoder, scorer, dense_candidates=cfg.dense_candidates, k=cfg.rerank_k)
    return ChunkIndex({p.id: p for p in paragraphs}, chunks, retriever)


def index_document(
    document: str, encoder: DenseEncoder, scorer: PairScorer | None, cfg: DualConfig, doc_id: str = "doc"
) -> ChunkIndex:
    """One long document (the LongBench setting): blank-line paragraphs, then :func:`index_paragraphs`."""
    return index_paragraphs(split_document(document, doc_id), encoder, scorer, cfg)
