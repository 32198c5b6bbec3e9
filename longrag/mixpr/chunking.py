"""Sentence chunking as in the MixPR paper (Section 4, "Chunking method").

1. The text is split into sentences (``longrag.text.sentences``; a single newline does not end a
   sentence by itself, a blank line does, and so does sentence punctuation before a newline: a
   document of facts written one per line as ``x = y.`` gets one sentence per line even where a
   line starts with a lower-case letter).
2. A sentence of more than ``max_words`` words is split along its newlines.
3. A piece that still has more than ``max_words`` words is cut at word boundaries into
   ``ceil(words / max_words)`` pieces whose word counts differ by at most one.

Words are runs of non-whitespace. Every chunk keeps its position (0-based, in document order) and
its character span in the original text, so ``text[start:end] == chunk text`` always holds.

:func:`chunk_text` does the per-line and per-word work with numpy over a whitespace mask of the
whole text (HashHop-like documents have one line per fact); :func:`chunk_text_reference` is the
same rule written as a plain loop, and tests check that both agree.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from longrag.text.sentences import sentence_spans

__all__ = ["Chunks", "chunk_text", "chunk_text_reference", "split_words_evenly", "whitespace_mask"]

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

    def concat(self, other: Chunks, offset: int) -> Chunks:
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
    """Chunk ``text`` by the paper's rule (see the module docstring). Same output as
    :func:`chunk_text_reference`, with the per-line and per-word work done in numpy: word counts
    come from one whitespace mask of the whole text, over-long sentences are cut into lines and
    even word pieces with array operations."""
    if not isinstance(text, str):
        raise ValueError(f"text must be str, got {type(text).__name__}")
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    spans = sentence_spans(_join_single_newlines(text), line_breaks=False)
    if not spans:
        return Chunks([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    sent = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    cls = _char_classes(text)
    nonws = cls == _OTHER
    word_start = nonws.copy()
    word_start[1:] &= ~nonws[:-1]
    w_start = np.flatnonzero(word_start)  # sorted positions where a word begins

    def n_words(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # words of text[a:b], a < b
        cont = nonws[a] & (a > 0) & nonws[np.maximum(a - 1, 0)]  # a word that began before a
        return np.searchsorted(w_start, b) - np.searchsorted(w_start, a) + cont

    s_n = n_words(sent[:, 0], sent[:, 1])
    short = s_n <= max_words
    parts_s = [sent[short, 0]]
    parts_e = [sent[short, 1]]
    parts_n = [s_n[short]]
    long_s, long_e = sent[~short, 0], sent[~short, 1]
    if long_s.size:
        # lines of the over-long sentences: text between newlines, clipped to the sentence
        nl = np.flatnonzero(cls == _NEWLINE)
        sid = np.searchsorted(long_s, nl, side="right") - 1
        inside = (sid >= 0) & (nl < long_e[np.maximum(sid, 0)])
        nl = nl[inside]
        a = np.sort(np.concatenate([long_s, nl + 1]))
        b = np.sort(np.concatenate([nl, long_e]))
        keep = a < b
        a, b = a[keep], b[keep]
        l_n = n_words(a, b)
        a, b, l_n = a[l_n > 0], b[l_n > 0], l_n[l_n > 0]
        w_end = np.flatnonzero(nonws & ~np.append(nonws[1:], False)) + 1
        fits = l_n <= max_words
        # a line that fits: the whole line, leading/trailing whitespace excluded
        fa, fb = a[fits], b[fits]
        first = np.where(nonws[fa], fa, w_start[np.minimum(np.searchsorted(w_start, fa), w_start.size - 1)])
        last = np.where(nonws[fb - 1], fb, w_end[np.searchsorted(w_end, fb, side="right") - 1])
        parts_s.append(first)
        parts_e.append(last)
        parts_n.append(l_n[fits])
        # an over-long line: ceil(n / max_words) consecutive word pieces of near-equal size
        oa, on = a[~fits], l_n[~fits]
        if oa.size:
            w0 = np.searchsorted(w_start, oa)  # line starts are never inside a word
            k = -(-on // max_words)
            base, extra = on // k, on % k
            line = np.repeat(np.arange(oa.size), k)
            j = np.arange(line.size) - np.repeat(np.cumsum(k) - k, k)  # piece index within its line
            size = base[line] + (j < extra[line])
            off = j * base[line] + np.minimum(j, extra[line])
            first_w = w0[line] + off
            parts_s.append(w_start[first_w])
            parts_e.append(w_end[first_w + size - 1])
            parts_n.append(size)
    starts = np.concatenate(parts_s)
    order = np.argsort(starts, kind="stable")
    starts = starts[order]
    ends = np.concatenate(parts_e)[order]
    counts = np.concatenate(parts_n).astype(np.int64)[order]
    texts = [text[i:j] for i, j in zip(starts.tolist(), ends.tolist())]
    return Chunks(texts=texts, starts=starts, ends=ends, n_words=counts)


# A newline between two ordinary characters: not after sentence punctuation (alone or followed by
# one closing quote or bracket) or whitespace, and not before whitespace or a digit (a possible
# "12." list number). The newline is matched first and the characters before it checked by
# look-behinds, so the regex engine scans for newlines instead of trying them at every position.
_P, _C = r".!?\u2026", r"'\"\u2019\u201d\u00bb)\]"
_PLAIN_NEWLINE = re.compile(rf"\n(?:(?<=[^{_P}{_C}\s]\n)|(?<=[^{_P}{_C}\s][{_C}]\n))(?=[^\s0-9])")


def _join_single_newlines(text: str) -> str:
    """``text`` with the newlines that cannot change a sentence boundary replaced by a space (same
    length), so the splitter (``line_breaks=False``) no longer visits each of them (HashHop-like
    text has one per line). Every newline that may matter is kept: after sentence punctuation, in a
    blank line, before a list number (``12. Item``). The test looks at a character or two, so some
    harmless newlines are kept too: the splitter reads a single newline as plain whitespace."""
    if "\n" not in text:
        return text
    return _PLAIN_NEWLINE.sub(" ", text)


# Character classes of the chunker: what str.split() splits on (str.isspace()), and "\n" among it.
_OTHER, _SPACE, _NEWLINE = 0, 1, 2


def _codepoints(text: str) -> np.ndarray:
    """uint32 (len(text),) code points (lone surrogates kept)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


@functools.cache
def _class_table() -> np.ndarray:
    """uint8 lookup table over code points 0..max: the class of each (``_SPACE`` where
    ``str.isspace()`` holds, ``_NEWLINE`` for "\\n"); every code point above the table's end is
    ``_OTHER`` (the last entry stands for them)."""
    ws = [c for c in range(0x110000) if chr(c).isspace()]
    table = np.full(max(ws) + 2, _OTHER, dtype=np.uint8)
    table[ws] = _SPACE
    table[ord("\n")] = _NEWLINE
    return table


@functools.cache
def _latin1_classes() -> bytes:
    """``bytes.translate`` table: Latin-1 byte -> its class (the first 256 entries of the table)."""
    return _class_table()[:256].tobytes()


def _char_classes(text: str) -> np.ndarray:
    """uint8 (len(text),): the class of each character. Latin-1 text (ASCII included) is classified
    by ``bytes.translate`` on its one-byte encoding, any other text by a lookup of its code points."""
    try:
        raw = text.encode("latin-1")
    except UnicodeEncodeError:
        return _class_table().take(_codepoints(text), mode="clip")  # clip: above the table is _OTHER
    return np.frombuffer(bytearray(raw.translate(_latin1_classes())), dtype=np.uint8)


def whitespace_mask(text: str) -> np.ndarray:
    """bool (len(text),): ``text[i].isspace()`` for every i."""
    return _char_classes(text) != _OTHER


def chunk_text_reference(text: str, max_words: int = 32) -> Chunks:
    """The rule written plainly, one sentence and line at a time (slow: a Python loop over lines;
    the reference that :func:`chunk_text` is tested against)."""
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
