"""Sentence chunks with a word budget, one-sentence overlap and tail merging, each mapped to its source paragraph.

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Section 4.1: sentences are the smallest unit; a chunk holds whole
sentences up to a length limit; a sliding window repeats the end of the previous chunk so no chunk
starts mid-thought; a short chunk at the end of a paragraph is merged into the one before. Every
chunk records its paragraph id and sentence/character span so the extractor (Section 4.2) can map
it back to the source paragraph.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from longrag.text.sentences import sentence_spans

__all__ = ["SourceParagraph", "DualChunk", "sentence_windows", "chunk_paragraph", "chunk_paragraphs", "split_document"]

_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")


@dataclass(frozen=True)
class SourceParagraph:
    """A paragraph chunks map back to: ``id`` is unique in a corpus (``doc/paragraph``)."""

    id: str
    text: str
    title: str = ""


@dataclass(frozen=True)
class DualChunk:
    """Whole sentences ``[sentence_start, sentence_end)`` of paragraph ``paragraph_id``; ``text`` is
    ``paragraph.text[char_start:char_end]`` (original whitespace kept)."""

    chunk_id: int
    paragraph_id: str
    text: str
    sentence_start: int
    sentence_end: int
    char_start: int
    char_end: int
    n_words: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check(max_words: int, overlap_sentences: int, min_tail_words: int | None) -> int:
    if not isinstance(max_words, int) or max_words <= 0:
        raise ValueError(f"max_words must be a positive int, got {max_words!r}")
    if not isinstance(overlap_sentences, int) or overlap_sentences < 0:
        raise ValueError(f"overlap_sentences must be an int >= 0, got {overlap_sentences!r}")
    if min_tail_words is None:
        return max(1, max_words // 4)
    if not isinstance(min_tail_words, int) or min_tail_words <= 0:
        raise ValueError(f"min_tail_words must be a positive int or None, got {min_tail_words!r}")
    return min_tail_words


def sentence_windows(
    n_words: Sequence[int], max_words: int, overlap_sentences: int = 1, min_tail_words: int | None = None
) -> list[tuple[int, int]]:
    """``[start, end)`` sentence windows over sentences of ``n_words`` words each.

    A window takes sentences while they fit ``max_words`` (always at least one, so a sentence longer
    than the budget is a chunk of its own); the next starts ``overlap_sentences`` before the end (and
    always after the previous start). A last window bringing fewer than ``min_tail_words`` new words
    is merged into the previous one (which may then exceed the budget by less than that)."""
    min_tail = _check(max_words, overlap_sentences, min_tail_words)
    n = len(n_words)
    windows: list[tuple[int, int]] = []
    start = 0
    while start < n:
        end, words = start + 1, n_words[start]
        while end < n and words + n_words[end] <= max_words:
            words += n_words[end]
            end += 1
        new_from = windows[-1][1] if windows else start
        if windows and end == n and sum(n_words[new_from:end]) < min_tail:
            windows[-1] = (windows[-1][0], end)  # tail merge
            break
        windows.append((start, end))
        if end == n:
            break
        start = max(end - overlap_sentences, start + 1)
    return windows


def chunk_paragraph(
    paragraph: SourceParagraph,
    max_words: int = 200,
    overlap_sentences: int = 1,
    min_tail_words: int | None = None,
    first_chunk_id: int = 0,
) -> list[DualChunk]:
    """The chunks of one paragraph (see :func:`sentence_windows`), ids from ``first_chunk_id``."""
    spans = sentence_spans(paragraph.text)
    words = [len(paragraph.text[s:e].split()) for s, e in spans]
    out: list[DualChunk] = []
    for a, b in sentence_windows(words, max_words, overlap_sentences, min_tail_words):
        cs, ce = spans[a][0], spans[b - 1][1]
        out.append(
            DualChunk(
                chunk_id=first_chunk_id + len(out),
                paragraph_id=paragraph.id,
                text=paragraph.text[cs:ce],
                sentence_start=a,
                sentence_end=b,
                char_start=cs,
                char_end=ce,
                n_words=sum(words[a:b]),
            )
        )
    return out


def chunk_paragraphs(
    paragraphs: Sequence[SourceParagraph],
    max_words: int = 200,
    overlap_sentences: int = 1,
    min_tail_words: int | None = None,
) -> list[DualChunk]:
    """Chunks of many paragraphs with corpus-wide ids; paragraph ids must be unique."""
    seen: set[str] = set()
    out: list[DualChunk] = []
    for p in paragraphs:
        if not isinstance(p, SourceParagraph):
            raise ValueError(f"expected SourceParagraph, got {type(p).__name__}")
        if p.id in seen:
            raise ValueError(f"duplicate paragraph id {p.id!r}: chunks must map back to one paragraph")
        seen.add(p.id)
        out.extend(chunk_paragraph(p, max_words, overlap_sentences, min_tail_words, first_chunk_id=len(out)))
    return out


def split_document(text: str, doc_id: str = "doc") -> list[SourceParagraph]:
    """One long document -> its paragraphs (blank-line separated), ids ``{doc_id}/{i}``. A document
    without blank lines is one paragraph."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("document must be a non-empty str")
    parts = [p.strip() for p in _BLANK_LINE.split(text)]
    return [SourceParagraph(id=f"{doc_id}/{i}", text=p) for i, p in enumerate(x for x in parts if x)]
