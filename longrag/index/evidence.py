"""The documents of a retrieved unit in the order of their own evidence (MaxP per document).

A grouped unit holds several documents in the order grouping met them (Algorithm 1 walks the link
graph), not in the order of their relevance to a question. The reader reads a unit from its first
word and stops at its token budget (``reader.max_context_tokens``), so a hop that MaxP retrieved
inside a 2K-token unit may never be read. Scoring each document by its best chunk (the MaxP rule
one level down) and putting the best first keeps the unit whole and its evidence in front. On the
MuSiQue sample (100 questions, grouped units, MiniLM) the gold paragraphs inside the first 1K
tokens of the ranked units rose from 40% to 62% (260 tokens: 21% to 45%), but the 1.5B reader
did not answer better over them (F1 22.0 against 22.8 on 50 questions; docs/evaluation.md,
"Multi-hop evidence"). ``retrieval.document_order`` chooses; the default, ``packed``, ranks paragraphs by
the chunk spans :func:`scored_evidence` returns (:mod:`longrag.reading.packing`).

Pure functions over :class:`longrag.types.Unit` records and chunk texts; the shard
(``actors/index_shard.py``) scores the chunks and calls :func:`order_by_evidence`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import replace

from longrag.index.chunking import document_spans
from longrag.index.grouping import UNIT_SEPARATOR
from longrag.types import Unit

__all__ = ["chunk_documents", "chunk_offsets", "document_scores", "order_by_evidence", "reorder_documents",
           "scored_evidence"]


def chunk_offsets(unit: Unit, chunk_texts: Sequence[str]) -> list[tuple[int, int]]:
    """The ``(start, end)`` of each chunk inside ``unit.text``, chunks in position order. Every
    chunk is a verbatim slice of one document (``longrag.index.chunking``), so each is found after
    the previous one; a chunk not found (a unit rebuilt without its chunks) raises."""
    out: list[tuple[int, int]] = []
    pos = 0
    for i, text in enumerate(chunk_texts):
        j = unit.text.find(text, pos)
        if j < 0:
            raise ValueError(f"chunk {i} of unit {unit.unit_id!r} is not in the unit's text after offset {pos}")
        out.append((j, j + len(text)))
        pos = j + len(text)
    return out


def chunk_documents(unit: Unit, chunk_texts: Sequence[str]) -> list[int]:
    """The ordinal (into ``unit.doc_ids``) of the document holding each chunk, chunks in position order."""
    return _documents_of(unit, chunk_offsets(unit, chunk_texts), document_spans(unit))


def _documents_of(unit: Unit, offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int]:
    if len(spans) != len(unit.doc_ids):
        # The layout was not found (document_spans fell back to one span): one document's worth.
        return [0] * len(offsets)
    starts = [s for s, _ in spans]
    return [bisect_right(starts, j) - 1 for j, _ in offsets]


def document_scores(n_docs: int, chunk_docs: Sequence[int], chunk_scores: Sequence[float]) -> list[float | None]:
    """Per document, the best score of its chunks (MaxP); None for a document without a chunk."""
    if len(chunk_docs) != len(chunk_scores):
        raise ValueError(f"{len(chunk_docs)} chunk documents but {len(chunk_scores)} chunk scores")
    best: list[float | None] = [None] * n_docs
    for d, s in zip(chunk_docs, chunk_scores):
        s = float(s)
        cur = best[d]
        if cur is None or s > cur:
            best[d] = s
    return best


def reorder_documents(unit: Unit, order: Sequence[int]) -> Unit:
    """The unit with its documents in ``order`` (a permutation of its document ordinals): ids,
    titles and text move together, the text joined as grouping joins it."""
    n = len(unit.doc_ids)
    if sorted(order) != list(range(n)):
        raise ValueError(f"order {list(order)} is not a permutation of the unit's {n} documents")
    spans = document_spans(unit)
    if len(spans) != n or list(order) == list(range(n)):
        return unit
    text = UNIT_SEPARATOR.join(unit.text[s:e] for s, e in (spans[i] for i in order))
    return replace(unit, doc_ids=[unit.doc_ids[i] for i in order], titles=[unit.titles[i] for i in order],
                   text=text)


def order_by_evidence(unit: Unit, chunk_texts: Sequence[str], chunk_scores: Sequence[float]) -> tuple[Unit, list[float | None]]:
    """The unit with its documents best-first by their best chunk's score (ties and documents
    without chunks keep their place after the scored ones), and the scores in the new order."""
    ordered, scores, _ = scored_evidence(unit, chunk_texts, chunk_scores)
    return ordered, scores


def scored_evidence(unit: Unit, chunk_texts: Sequence[str], chunk_scores: Sequence[float]
                    ) -> tuple[Unit, list[float | None], list[tuple[int, int, float]]]:
    """:func:`order_by_evidence`, and each chunk's ``(start, end, score)`` inside the reordered
    text (a chunk moves with its document): what the reader's packer ranks paragraphs by
    (:mod:`longrag.reading.packing`)."""
    offsets = chunk_offsets(unit, chunk_texts)
    spans = document_spans(unit)
    chunk_docs = _documents_of(unit, offsets, spans)
    scores = document_scores(len(unit.doc_ids), chunk_docs, chunk_scores)
    order = sorted(range(len(scores)), key=lambda i: (scores[i] is None, -(scores[i] or 0.0), i))
    ordered = reorder_documents(unit, order)
    if ordered is unit:  # not moved (one document, the stored order, or the layout not found)
        moved = offsets
    else:
        new_start, pos = {}, 0
        for d in order:
            new_start[d] = pos
            pos += spans[d][1] - spans[d][0] + len(UNIT_SEPARATOR)
        moved = [(a - spans[d][0] + new_start[d], b - spans[d][0] + new_start[d])
                 for (a, b), d in zip(offsets, chunk_docs)]
    triples = sorted((a, b, float(s)) for (a, b), s in zip(moved, chunk_scores))
    return ordered, [scores[i] for i in order], triples
