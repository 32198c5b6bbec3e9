"""Fast rule-based sentence splitting for English prose (Wikipedia-like text).

A sentence ends at ``.``, ``!``, ``?`` or an ellipsis (with any closing quotes or brackets) that is
followed by whitespace and then a character that is not lower case, unless the word before the
period is an abbreviation (``Dr.``, ``e.g.``, ``U.S.``, a single initial such as ``L.``) or a list
number at the start of a line (``12. Item``). Sentence punctuation followed by a line break always
ends the sentence, whatever comes next: a line ``x = y.`` is a sentence even when the next line
starts with a lower-case letter. Line breaks are boundaries too (every newline by default, only
blank lines with ``line_breaks=False``).

One regular expression finds the candidate boundaries and a few cheap checks filter them, so it
runs at several million characters per second in pure Python (see the module's tests and the
grouping/chunking report for measurements). Spans are character offsets into the input with
surrounding whitespace excluded; nothing in the text is changed or dropped except whitespace.
"""

from __future__ import annotations

import re

__all__ = ["ABBREVIATIONS", "sentence_spans", "split_sentences"]

# Words (lower case, without the final period) after which a period rarely ends a sentence.
ABBREVIATIONS = frozenset(
    """
    mr mrs ms mx dr prof st jr sr rev hon gov sen rep pres gen col lt maj capt cmdr sgt cpl adm fr
    vs etc cf al approx ca esp fig figs no nos vol vols pp p ch sec art ed eds op ff
    inc ltd co corp bros assn dept univ est mt ft ave blvd rd
    jan feb mar apr jun jul aug sep sept oct nov dec
    """.split()
)

# A candidate boundary: a newline (group 1 unset; the match spans the whitespace run) or a run of
# sentence punctuation with closing quotes/brackets followed by whitespace (group 1 = the gap).
# Starting with one character class keeps the regex engine on its fast scanning path.
_CANDIDATE = re.compile(r"""[.!?\u2026\n](?:(?<=\n)\s*|[.!?\u2026]*['"\u2019\u201d\u00bb)\]]*(\s+))""")
_OPENERS = "\"'([\u201c\u2018\u00ab"


def sentence_spans(text: str, line_breaks: bool = True) -> list[tuple[int, int]]:
    """``(start, end)`` character offsets of the sentences of ``text``, in order, whitespace
    excluded. ``line_breaks=True`` ends a sentence at every newline; ``False`` only at blank lines
    (use it for hard-wrapped text)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be str, got {type(text).__name__}")
    n = len(text)
    spans: list[tuple[int, int]] = []
    append = spans.append
    start = 0
    abbrevs = ABBREVIATIONS
    for m in _CANDIDATE.finditer(text):
        gap = m.group(1)
        if gap is None:  # a newline and the whitespace after it
            gs, ge = m.span()
            if not line_breaks and text.count("\n", gs, ge) < 2:
                continue
        else:  # sentence punctuation followed by whitespace
            gs, ge = m.span(1)
            if "\n" not in gap and ge < n:  # punctuation before a line break always ends a sentence
                if text[ge].islower():
                    continue
                p = m.start()
                if gs - p == 1 and text[p] == "." and _is_abbreviation(text, p, abbrevs):
                    continue
        e = gs
        if start < e:
            if text[start].isspace() or text[e - 1].isspace():
                _add(text, start, e, spans)
            else:
                append((start, e))
        start = ge
    _add(text, start, n, spans)
    return spans


def split_sentences(text: str, line_breaks: bool = True) -> list[str]:
    """The sentences of ``text`` (see ``sentence_spans``)."""
    return [text[s:e] for s, e in sentence_spans(text, line_breaks=line_breaks)]


def _is_abbreviation(text: str, p: int, abbrevs: frozenset[str]) -> bool:
    """Whether the word that ends at the period ``text[p]`` is an abbreviation, an initial, or the
    number of a numbered list item at the start of a line (``3. Item``)."""
    lo = p - 32 if p > 32 else 0
    i = max(text.rfind(" ", lo, p), text.rfind("\n", lo, p), text.rfind("\t", lo, p)) + 1
    if i == 0 and lo > 0:  # a 32+ character "word": not an abbreviation
        return False
    word = text[i:p].lstrip(_OPENERS)
    if not word:
        return False
    if word.isascii() and word.isdigit() and _at_line_start(text, i):
        return True  # "12. Item": a list marker, not a sentence end
    if len(word) == 1:
        return word.isalpha()  # an initial: "Evan L. Morris"
    if "." in word:  # "U.S", "e.g", "Ph.D", "D.C"
        return True
    return word.lower() in abbrevs


def _at_line_start(text: str, i: int) -> bool:
    """Whether only spaces or tabs stand between the previous newline (or the text start) and ``i``."""
    j = i - 1
    while j >= 0 and text[j] in " \t":
        j -= 1
    return j < 0 or text[j] == "\n"


def _add(text: str, s: int, e: int, spans: list[tuple[int, int]]) -> None:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    if s < e:
        spans.append((s, e))
