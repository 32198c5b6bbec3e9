"""Pack the reader's budget with evidence: the top units' paragraphs, best first, within the budget.

A small reader reads ~1K tokens of a 2 x ~1.4K-token top 2 (``reader.max_context_tokens``), so which
of the units' tokens it reads decides the answer. Whole units in rank order (the stored order) give
it whatever grouping put first; documents best first (``retrieval.document_order=evidence``) give it
each unit's best documents but still stop in the middle of the first unit. Packing ranks the
paragraphs of *all* the given units by their own score -- the best MaxP chunk score among the chunks
that overlap the paragraph, scored on the shard from its stored vectors for this question; the
unit's first-stage rank breaks ties -- takes them best first while they fit the budget (a paragraph
that does not fit is skipped so a shorter one may still get in), and writes them back as the units
are written: the units in rank order, inside each unit its documents best first, inside each document
the chosen paragraphs in reading order under the document's title.

The units must carry their chunks' scores (:attr:`longrag.types.Unit.chunk_scores`, set by
``retrieval.document_order=packed``); a unit without them has each paragraph scored None and
ranked after every scored one. Pure functions; the reader calls :func:`pack_units` when its units
carry scores (:meth:`longrag.reading.reader.LongReader.fit`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from longrag.index.chunking import document_spans
from longrag.reading.prompts import UNIT_SEPARATOR, format_unit
from longrag.text.tokens import trim_to_tokens
from longrag.types import Unit

__all__ = ["PackedParagraph", "PackedUnits", "pack_units", "paragraph_rank", "paragraphs_of"]

PARAGRAPH_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class PackedParagraph:
    """One paragraph of a given unit: where it is, its score and whether the reader read it."""

    unit_id: str
    #: Rank of its unit among the units given (0 = the top unit).
    unit_rank: int
    #: Ordinal of its document in ``Unit.doc_ids`` and the paragraph's ordinal inside that document.
    doc: int
    paragraph: int
    title: str
    start: int
    end: int
    #: The best score of the unit's chunks that overlap it (None: no chunk score covers it).
    score: float | None
    tokens: int = 0
    read: bool = False

    @property
    def key(self) -> tuple[int, int, int]:
        """(unit rank, document, paragraph): which paragraph of the given units this is."""
        return self.unit_rank, self.doc, self.paragraph

    def to_trace(self) -> dict[str, object]:
        return {"unit_id": self.unit_id, "title": self.title, "paragraph": self.paragraph,
                "score": None if self.score is None else round(self.score, 4), "tokens": self.tokens}


@dataclass
class PackedUnits:
    """The packed context: reduced units (only the paragraphs read) in the order the reader reads
    them, their formatted blocks, and every paragraph of the given units in reading order, with ``read`` set."""

    units: list[Unit]
    blocks: list[str]
    tokens: int
    paragraphs: list[PackedParagraph]

    @property
    def cut(self) -> list[PackedParagraph]:
        return [p for p in self.paragraphs if not p.read]

    @property
    def read(self) -> list[PackedParagraph]:
        return [p for p in self.paragraphs if p.read]


def paragraphs_of(unit: Unit, rank: int = 0) -> list[PackedParagraph]:
    """The paragraphs of ``unit`` in reading order, scored from ``unit.chunk_scores``. A document is
    ``Title\\ntext`` (``longrag.index.grouping``); its paragraphs are its text's blank-line-separated
    blocks, the title line left out (it is written back once per document)."""
    text = unit.text
    spans = document_spans(unit)
    titles = list(unit.titles) if len(spans) == len(unit.titles) else [unit.titles[0] if unit.titles else ""]
    chunks = sorted(unit.chunk_scores or [], key=lambda c: c[0])
    out: list[PackedParagraph] = []
    for d, ((s, e), title) in enumerate(zip(spans, titles)):
        body = s + len(title) + 1 if title and text.startswith(f"{title}\n", s) else s
        pos, n = body, 0
        while pos < e:
            j = text.find(PARAGRAPH_SEPARATOR, pos, e)
            end = e if j < 0 else j
            a, b = _strip(text, pos, end)
            if a < b:
                out.append(PackedParagraph(unit.unit_id, rank, d, n, title, a, b, _score(chunks, a, b)))
                n += 1
            pos = end + len(PARAGRAPH_SEPARATOR)
    return out


def _strip(text: str, a: int, b: int) -> tuple[int, int]:
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    return a, b


def _score(chunks: Sequence[tuple[int, int, float]], a: int, b: int) -> float | None:
    best: float | None = None
    for s, e, score in chunks:
        if s >= b:
            break
        if e > a and (best is None or score > best):
            best = float(score)
    return best


def paragraph_rank(p: PackedParagraph) -> tuple[bool, float, int, int, int]:
    return (p.score is None, -(p.score if p.score is not None else -math.inf), p.unit_rank, p.doc, p.paragraph)


def _write(units: Sequence[Unit], chosen: Sequence[PackedParagraph],
           texts: dict[tuple[int, int, int], str]) -> tuple[list[Unit], list[str]]:
    """The reduced units (in rank order; documents best first; paragraphs in reading order) and their blocks."""
    by_unit: dict[int, dict[int, list[PackedParagraph]]] = {}
    for p in chosen:
        by_unit.setdefault(p.unit_rank, {}).setdefault(p.doc, []).append(p)
    reduced: list[Unit] = []
    for r in sorted(by_unit):
        unit, docs = units[r], by_unit[r]
        order = sorted(docs, key=lambda d: min(paragraph_rank(p) for p in docs[d]))
        parts, doc_ids, titles = [], [], []
        for d in order:
            paras = sorted(docs[d], key=lambda p: p.paragraph)
            body = PARAGRAPH_SEPARATOR.join(texts.get(p.key, unit.text[p.start:p.end]) for p in paras)
            title = paras[0].title
            parts.append(f"{title}\n{body}" if title else body)
            doc_ids.append(unit.doc_ids[d] if d < len(unit.doc_ids) else unit.unit_id)
            titles.append(title)
        reduced.append(Unit(unit_id=unit.unit_id, doc_ids=doc_ids, titles=titles, text=UNIT_SEPARATOR.join(parts),
                            n_tokens=0))
    return reduced, [format_unit(u) for u in reduced]


def pack_units(
    units: Sequence[Unit], budget_tokens: int, count_tokens: Callable[[str], int],
    truncate: Callable[[str, int], str] | None = None, *, min_partial_tokens: int = 128,
) -> PackedUnits:
    """The paragraphs of ``units`` (best first, ties by unit rank) that fit ``budget_tokens`` of
    formatted context (titles, separators and all, counted with the reader's ``count_tokens``).

    A paragraph is taken when its own tokens plus what it adds (its document's title, its unit's
    header, separators) fit what is left; one that does not fit is skipped and the next tried. The
    written blocks are then counted whole, and while they exceed the budget (tokens merge across
    joins) the last paragraph taken is dropped. When not even the best paragraph fits, it is cut to
    the budget with ``truncate(text, n)`` (the top evidence always gets in, as the top unit does)."""
    if budget_tokens <= 0:
        raise ValueError(f"budget_tokens must be positive, got {budget_tokens}")
    ranked = sorted((replace(p, tokens=count_tokens(u.text[p.start:p.end]))
                     for r, u in enumerate(units) for p in paragraphs_of(u, r)), key=paragraph_rank)
    sep = count_tokens(PARAGRAPH_SEPARATOR)
    header = count_tokens("Title: \n")
    title_cost = {t: count_tokens(t) for t in {p.title for p in ranked}}
    room = budget_tokens
    chosen: list[PackedParagraph] = []
    docs: set[tuple[int, int]] = set()
    seen_units: set[int] = set()
    for p in ranked:
        extra = p.tokens + sep
        if (p.unit_rank, p.doc) not in docs:  # its title in the header and above the document
            extra += 2 * title_cost[p.title] + sep
        if p.unit_rank not in seen_units:
            extra += header + sep
        if extra <= room:
            chosen.append(p)
            room -= extra
            docs.add((p.unit_rank, p.doc))
            seen_units.add(p.unit_rank)
    texts: dict[tuple[int, int, int], str] = {}
    reduced, blocks = _write(units, chosen, texts)
    tokens = count_tokens(UNIT_SEPARATOR.join(blocks)) if blocks else 0
    while chosen and tokens > budget_tokens:
        chosen.pop()  # the lowest-ranked paragraph taken
        reduced, blocks = _write(units, chosen, texts)
        tokens = count_tokens(UNIT_SEPARATOR.join(blocks)) if blocks else 0
    taken = {p.key for p in chosen}
    skipped = [p for p in ranked if p.key not in taken]
    if skipped and (not chosen or budget_tokens - tokens >= min_partial_tokens):
        # The best paragraph left out fills what is left, cut (alone over the budget, it is cut to it).
        top = skipped[0]
        cut = truncate or functools.partial(trim_to_tokens, count_tokens=count_tokens)
        extra = header + 2 * title_cost[top.title] + 3 * sep
        n = budget_tokens - tokens - extra
        while n > 0:
            texts[top.key] = cut(units[top.unit_rank].text[top.start:top.end], n)
            r2, b2 = _write(units, [*chosen, top], texts)
            t2 = count_tokens(UNIT_SEPARATOR.join(b2))
            if t2 <= budget_tokens:
                chosen, reduced, blocks, tokens = [*chosen, top], r2, b2, t2
                break
            n -= max(1, t2 - budget_tokens)
    read = {p.key for p in chosen}
    return PackedUnits(units=reduced, blocks=blocks, tokens=tokens,
                       paragraphs=[replace(p, read=p.key in read) for p in sorted(ranked, key=lambda p: p.key)])
