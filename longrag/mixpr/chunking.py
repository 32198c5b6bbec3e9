"""Sentence chunking as in the MixPR paper (Section 4, "Chunking method").

1. The text is split into sentences (``longrag.sentences``; a single newline does not end a
   sentence here, a blank line does).
2. A sentence of more than ``max_words`` words is split along its newlines.
3. A piece that still has more than ``max_words`` words is cut at word boundaries into
   ``ceil(words / max_words)`` pieces whose word counts differ by at most one.

Words are runs of non-whitespace. Every chunk keeps its position (0-based, in document order) and
its character span in the original text, so ``text[start:end] == chunk text`` always holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from longrag.sentences import sentence_spans

__all__ = ["Chunks", "chunk_text", "split_words_evenly"]

_WORD = re.compile(r"\S+")
_LINE = re.compile(r"[^\n]+")


@dataclass
class Chunks:
    """The chunks of one document, column-wise (cheap for 100K+ chunks).

    ``texts[i]`` is chunk ``i``; ``starts[i]:ends[i]`` its span in the source text; ``n_words[i]``
    its word count. Arrays are int64 of shape (n,)."""

    texts: list[str]
    starts: np.ndarray
    ends: np.ndarray
    n_words: np.ndarray

    def __len__(self) -> int:
        return len(self.texts)

    def concat(self, other: "Chunks", offset: int) -> "Chunks":
        """These chunks followed by ``other`` whose spans are shifted by ``offset`` characters."""
        return Chunks(
            texts=self.texts + other.texts,
            starts=np.concatenate([self.starts, other.starts + offset]),
            ends=np.concatenate([self.ends, other.ends + offset]),
            n_words=np.concatenate([self.n_words, other.n_words]),
        )


def split_words_evenly(n_words: int, max_words: int) -> list[int]:
    """Sizes of ``ceil(n_words / max_words)`` consecutive pieces, each at most ``max_words`` and
    differing by at most one (larger pieces first)."""
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    if n_words <= 0:
        return []
    k = -(-n_words // max_words)
    base, extra = divmod(n_words, k)
    return [base + 1] * extra + [base] * (k - extra)


def chunk_text(text: str, max_words: int = 32) -> Chunks:
    """Chunk ``text`` by the paper's rule (see the module docstring)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be str, got {type(text).__name__}")
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    texts: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    counts: list[int] = []

    def emit(s: int, e: int, n: int) -> None:
        texts.append(text[s:e])
        starts.append(s)
        ends.append(e)
        counts.append(n)

    for s, e in sentence_spans(text, line_breaks=False):
        sent = text[s:e]
        n = len(sent.split())
        if n <= max_words:
            emit(s, e, n)
            continue
        # over-long sentence: its lines first
        for lm in _LINE.finditer(sent):
            line = lm.group()
            nw = len(line.split())
            if nw == 0:
                continue
            base = s + lm.start()
            if nw <= max_words:  # the whole line, surrounding whitespace excluded
                lead = len(line) - len(line.lstrip())
                emit(base + lead, base + len(line.rstrip()), nw)
                continue
            words = [(m.start(), m.end()) for m in _WORD.finditer(line)]
            i = 0
            for size in split_words_evenly(len(words), max_words):
                emit(base + words[i][0], base + words[i + size - 1][1], size)
                i += size
    return Chunks(
        texts=texts,
        starts=np.asarray(starts, dtype=np.int64),
        ends=np.asarray(ends, dtype=np.int64),
        n_words=np.asarray(counts, dtype=np.int64),
    )
