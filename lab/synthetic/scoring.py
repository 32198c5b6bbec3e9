"""Retrieval-only scores for synthetic samples.

``needle_recall``: a needle (supporting fact) counts as retrieved when every chunk that overlaps its
character span is among the retrieved chunks (a needle split over two chunks needs both).
``top_word_overlap``: for the global word tasks (cwe/fwe), the share of the document's top-n most
frequent words that are also among the top-n words of the retrieved text (the paper's measure).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["needle_recall", "needles_found", "top_word_overlap", "top_words"]

_WORD = re.compile(r"[a-z]+")


def needles_found(
    needles: Sequence[tuple[int, int]],
    chunk_starts: np.ndarray,
    chunk_ends: np.ndarray,
    retrieved: Iterable[int],
) -> list[bool]:
    """For each needle span, whether all chunks overlapping it are in ``retrieved`` (chunk
    positions). Chunk spans must be sorted and non-overlapping (as the chunker makes them)."""
    starts = np.asarray(chunk_starts, dtype=np.int64)
    ends = np.asarray(chunk_ends, dtype=np.int64)
    if starts.ndim != 1 or starts.shape != ends.shape:
        raise ValueError(f"chunk_starts/chunk_ends must be 1-D of equal shape, got {starts.shape} and {ends.shape}")
    got = set(int(r) for r in retrieved)
    out = []
    for s, e in needles:
        if e <= s:
            raise ValueError(f"needle span ({s}, {e}) is empty")
        lo = int(np.searchsorted(ends, s, side="right"))  # first chunk ending after s
        hi = int(np.searchsorted(starts, e, side="left"))  # chunks starting before e
        overlapping = range(lo, hi)
        out.append(len(overlapping) > 0 and all(i in got for i in overlapping))
    return out


def needle_recall(
    needles: Sequence[tuple[int, int]], chunk_starts: np.ndarray, chunk_ends: np.ndarray, retrieved: Iterable[int]
) -> float:
    """Fraction of needles retrieved (see ``needles_found``); 1.0 when there are no needles."""
    if not needles:
        return 1.0
    found = needles_found(needles, chunk_starts, chunk_ends, retrieved)
    return float(sum(found)) / len(found)


def top_words(text: str, n: int, exclude: frozenset[str] = frozenset()) -> list[str]:
    """The ``n`` most frequent lower-case alphabetic words (ties broken alphabetically)."""
    counts = Counter(w for w in _WORD.findall(text.lower()) if w not in exclude)
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def top_word_overlap(document: str, retrieved_text: str, n: int = 5) -> float:
    """Share of the document's top-``n`` words that are also top-``n`` in the retrieved text."""
    ref = top_words(document, n)
    if not ref:
        return 1.0
    got = set(top_words(retrieved_text, n))
    return sum(w in got for w in ref) / len(ref)
