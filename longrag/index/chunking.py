"""Cut retrieval units into chunks that fit the embedding model (MaxP scoring: LongRAG,
Jiang et al., 2024, "LongRAG: Enhancing Retrieval-Augmented Generation with Long-context LLMs",
Section 3.1 and Table 3).

Whole sentences are packed greedily up to ``max_tokens``. A sentence longer than that is cut at
word boundaries, and a word longer than that at character positions found by counting, so no
chunk ever exceeds ``max_tokens`` (the encoder never truncates silently). Every chunk is a verbatim
slice of the input: joining the chunks gives back the text up to whitespace. Inside a grouped unit
a chunk never spans two documents.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from longrag.index.grouping import UNIT_SEPARATOR
from longrag.text.sentences import sentence_spans
from longrag.text.tokens import TokenCounter
from longrag.types import Chunk, Unit

__all__ = ["chunk_spans", "chunk_text", "chunk_units", "document_spans"]

_WORD = re.compile(r"\S+")
Span = tuple[int, int]
Piece = tuple[int, int, int]  # (start, end, n_tokens)


def chunk_spans(text: str, max_tokens: int, counter: TokenCounter) -> list[Piece]:
    """``(start, end, n_tokens)`` of each chunk of ``text``; every ``n_tokens <= max_tokens``."""
    return _chunk_many([text], max_tokens, counter)[0]


def chunk_text(text: str, max_tokens: int, counter: TokenCounter) -> list[str]:
    """Chunks of ``text`` of at most ``max_tokens`` tokens each (empty text: no chunks)."""
    return [text[s:e] for s, e, _ in chunk_spans(text, max_tokens, counter)]


def document_spans(unit: Unit) -> list[Span]:
    """Character spans of the documents inside a unit built by ``longrag.index.grouping`` (documents
    written ``Title\\ntext`` and joined by a blank line). Falls back to one span for the whole text
    when the layout is not found; an untitled document stays with the one before it."""
    text = unit.text
    starts = [0]
    pos = 0
    for title in unit.titles[1:]:
        if not title:
            continue
        j = text.find(f"{UNIT_SEPARATOR}{title}\n", pos)
        if j < 0:
            return [(0, len(text))]
        pos = j + len(UNIT_SEPARATOR)
        starts.append(pos)
    ends = [s - len(UNIT_SEPARATOR) for s in starts[1:]] + [len(text)]
    return list(zip(starts, ends))


def chunk_units(units: Sequence[Unit], max_tokens: int, counter: TokenCounter) -> list[Chunk]:
    """Chunks of every unit, in order: ``chunk_id = f"{unit_id}:{i:04d}"``, ``position = i``
    (0-based within the unit). Each document of a grouped unit is chunked on its own."""
    pieces: list[str] = []
    owner: list[int] = []
    for k, u in enumerate(units):
        for s, e in document_spans(u):
            pieces.append(u.text[s:e])
            owner.append(k)
    per_piece = _chunk_many(pieces, max_tokens, counter)
    chunks: list[Chunk] = []
    next_pos = [0] * len(units)
    for k, text, spans in zip(owner, pieces, per_piece):
        u = units[k]
        for s, e, c in spans:
            i = next_pos[k]
            next_pos[k] += 1
            chunks.append(
                Chunk(chunk_id=f"{u.unit_id}:{i:04d}", unit_id=u.unit_id, position=i, text=text[s:e], n_tokens=c)
            )
    return chunks


def _chunk_many(texts: Sequence[str], max_tokens: int, counter: TokenCounter) -> list[list[Piece]]:
    """Chunk spans for many texts; tokens are counted in a few large batches."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"text {i} must be str, got {type(t).__name__}")
    sents = [sentence_spans(t) for t in texts]
    flat = [t[s:e] for t, sp in zip(texts, sents) for s, e in sp]
    counts = iter(counter.count_batch(flat))

    # pieces: (start, end, tokens) that each fit alone
    all_pieces: list[list[Piece]] = []
    for t, sp in zip(texts, sents):
        pieces: list[Piece] = []
        for s, e in sp:
            c = next(counts)
            if c <= max_tokens:
                pieces.append((s, e, c))
            else:
                pieces.extend(_split_long(t, s, e, max_tokens, counter))
        all_pieces.append(pieces)

    if getattr(counter, "additive", False):  # counts add up: packing by them is exact
        return [_pack(p, max_tokens) for p in all_pieces]
    return [_pack_verified(t, p, max_tokens, counter) for t, p in zip(texts, all_pieces)]


def _pack(pieces: list[Piece], max_tokens: int) -> list[Piece]:
    """Greedy packing by the pieces' own counts (assumes counts add up across whitespace). Pieces
    that touch (fragments of one over-long word) are never joined: their counts need not add up."""
    out: list[Piece] = []
    cs = ce = -1
    total = 0
    for s, e, c in pieces:
        if cs >= 0 and s > ce and total + c <= max_tokens:
            ce, total = e, total + c
        else:
            if cs >= 0:
                out.append((cs, ce, total))
            cs, ce, total = s, e, c
    if cs >= 0:
        out.append((cs, ce, total))
    return out


def _pack_exact(text: str, pieces: list[Piece], max_tokens: int, counter: TokenCounter) -> list[Piece]:
    """Greedy packing that counts every candidate chunk (slow path for non-additive tokenizers)."""
    out: list[Piece] = []
    cur: tuple[int, int, int] | None = None
    for s, e, c in pieces:
        if cur is not None:
            merged = counter.count(text[cur[0] : e])
            if merged <= max_tokens:
                cur = (cur[0], e, merged)
                continue
            out.append(cur)
        cur = (s, e, c)
    if cur is not None:
        out.append(cur)
    return out


def _split_long(text: str, s: int, e: int, max_tokens: int, counter: TokenCounter) -> list[Piece]:
    """Pieces of the span ``text[s:e]`` that fit: words packed greedily, over-long words cut."""
    words = [(m.start(), m.end()) for m in _WORD.finditer(text, s, e)]
    counts = counter.count_batch([text[a:b] for a, b in words])
    pieces: list[Piece] = []
    for (a, b), c in zip(words, counts):
        if c <= max_tokens:
            pieces.append((a, b, c))
        else:
            pieces.extend(_split_word(text, a, b, max_tokens, counter))
    return _pack_verified(text, pieces, max_tokens, counter)


def _pack_verified(text: str, pieces: list[Piece], max_tokens: int, counter: TokenCounter) -> list[Piece]:
    """``_pack``, then recount the packed spans; any over the limit is repacked exactly."""
    packed = _pack(pieces, max_tokens)
    real = counter.count_batch([text[s:e] for s, e, _ in packed])
    starts = [p[0] for p in pieces]
    out: list[Piece] = []
    for (s, e, _), c in zip(packed, real):
        if c <= max_tokens:
            out.append((s, e, c))
        else:  # the pieces inside this chunk, found by bisection (pieces are in text order)
            inner = pieces[bisect_left(starts, s) : bisect_right(starts, e - 1)]
            out.extend(_pack_exact(text, inner, max_tokens, counter))
    return out


def _split_word(text: str, a: int, b: int, max_tokens: int, counter: TokenCounter) -> list[Piece]:
    """Cut ``text[a:b]`` (no whitespace inside) into long prefixes that fit, found by counting
    (binary search inside a window of ``32 * max_tokens`` characters, so a huge blob stays linear)."""
    out: list[Piece] = []
    window = 32 * max_tokens
    while a < b:
        hi = min(b - a, window)
        c_hi = counter.count(text[a : a + hi])
        if c_hi <= max_tokens:
            out.append((a, a + hi, c_hi))
            a += hi
            continue
        first = counter.count(text[a : a + 1])
        if first > max_tokens:
            raise ValueError(f"max_tokens={max_tokens} is too small: one character {text[a]!r} counts {first} tokens")
        lo, c_lo = 1, first  # count(text[a:a+lo]) fits, count(text[a:a+hi]) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            c = counter.count(text[a : a + mid])
            if c <= max_tokens:
                lo, c_lo = mid, c
            else:
                hi = mid
        out.append((a, a + lo, c_lo))
        a += lo
    return out
