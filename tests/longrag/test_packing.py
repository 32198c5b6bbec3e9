"""The reader-context packer (longrag.reading.packing) and the chunk spans it ranks by
(longrag.index.evidence.scored_evidence), checked against references that never look at the
packer's own bookkeeping: paragraphs scored from the chunks' character sets, budgets counted on the
written text, and the best-first choice by brute force over every subset of a small unit."""

from __future__ import annotations

import itertools
import random

import pytest

from longrag.index.chunking import chunk_units
from longrag.index.evidence import order_by_evidence, scored_evidence
from longrag.index.units import make_units
from longrag.reading.packing import pack_units, paragraphs_of
from longrag.reading.prompts import UNIT_SEPARATOR, format_unit
from longrag.text.tokens import WhitespaceCounter
from longrag.types import Document, Unit

COUNTER = WhitespaceCounter(1.0)
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def count(text: str) -> int:
    return len(text.split())


def _para(rng: random.Random) -> str:
    return " ".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 9))).capitalize() + "." for _ in range(rng.randint(1, 4)))


def _docs(rng: random.Random, n: int, start: int = 0) -> list[Document]:
    return [Document(doc_id=f"d{i}", title=f"Title {i}", text="\n\n".join(_para(rng) for _ in range(rng.randint(1, 4))),
                     links=[f"Title {i + 1}"]) for i in range(start, start + n)]


def _scored_unit(rng: random.Random, docs: list[Document], uid: str = "u") -> tuple[Unit, dict[str, float]]:
    (unit,) = make_units(docs, kind="grouped", counter=COUNTER, budget=100_000)
    unit.unit_id = uid
    chunks = chunk_units([unit], 12, COUNTER)
    scores = {c.text: rng.random() for c in chunks}
    ordered, _, spans = scored_evidence(unit, [c.text for c in chunks], [scores[c.text] for c in chunks])
    ordered.chunk_scores = spans
    return ordered, scores


@pytest.mark.parametrize("seed", range(8))
def test_chunk_spans_follow_their_documents_when_reordered(seed):
    rng = random.Random(seed)
    unit, scores = _scored_unit(rng, _docs(rng, rng.randint(1, 5)))
    # each span is the chunk's own text in the reordered unit, with that chunk's score
    assert len(unit.chunk_scores) == len(scores) or len(set(scores)) < len(unit.chunk_scores)
    for a, b, s in unit.chunk_scores:
        assert scores[unit.text[a:b]] == s
    assert [a for a, _, _ in unit.chunk_scores] == sorted(a for a, _, _ in unit.chunk_scores)
    again, _ = order_by_evidence(unit, [unit.text[a:b] for a, b, _ in unit.chunk_scores],
                                 [s for _, _, s in unit.chunk_scores])
    assert again.text == unit.text  # already best first


def _reference_scores(unit: Unit) -> list[tuple[str, float | None]]:
    """Each paragraph (blank-line blocks, titles left out) with the best score of the chunks sharing a character."""
    covered: dict[int, float] = {}
    for a, b, s in unit.chunk_scores or []:
        for i in range(a, b):
            covered[i] = max(covered.get(i, s), s)
    out = []
    pos = 0
    for block in unit.text.split("\n\n"):
        start = unit.text.index(block, pos)
        pos = start + len(block)
        body, offset = block, start
        if block.split("\n", 1)[0] in unit.titles and "\n" in block:
            title, body = block.split("\n", 1)
            offset = start + len(title) + 1
        body_s = body.strip()
        a = offset + body.index(body_s)
        vals = [covered[i] for i in range(a, a + len(body_s)) if i in covered]
        out.append((body_s, max(vals) if vals else None))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_paragraph_scores_match_a_character_level_reference(seed):
    rng = random.Random(seed)
    unit, _ = _scored_unit(rng, _docs(rng, rng.randint(1, 4)))
    got = [(unit.text[p.start:p.end], p.score) for p in paragraphs_of(unit)]
    assert got == _reference_scores(unit)


@pytest.mark.parametrize("seed", range(10))
def test_packed_context_fits_and_reads_the_best_paragraphs(seed):
    rng = random.Random(100 + seed)
    u1, _ = _scored_unit(rng, _docs(rng, 3), "u1")
    u2, _ = _scored_unit(rng, _docs(rng, 3, start=3), "u2")
    budget = rng.randint(25, 90)
    packed = pack_units([u1, u2], budget, count)
    context = UNIT_SEPARATOR.join(packed.blocks)
    assert count(context) == packed.tokens <= budget
    # every paragraph marked read is in the context whole; every cut one is not
    for p in packed.paragraphs:
        text = ([u1, u2][p.unit_rank]).text[p.start:p.end]
        assert (text in context) == p.read, (p, context)
    # best first: a cut paragraph would not have fitted in place of nothing (no read paragraph is
    # worse than a cut one unless the cut one could not fit beside what was read before it)
    ranked = sorted(packed.paragraphs, key=lambda p: (p.score is None, -(p.score or 0), p.unit_rank, p.doc, p.paragraph))
    if packed.read:
        assert ranked[0].read or ranked[0].tokens > budget - 4
    # reading order inside each document, units in rank order
    for u in packed.units:
        assert u.unit_id in ("u1", "u2")
    assert [u.unit_id for u in packed.units] == sorted(u.unit_id for u in packed.units)
    for unit in packed.units:
        src = [u1, u2][[u1.unit_id, u2.unit_id].index(unit.unit_id)]
        for d_title in unit.titles:
            mine = [p for p in packed.read if p.unit_id == src.unit_id and p.title == d_title]
            positions = [unit.text.index(src.text[p.start:p.end]) for p in mine]
            assert positions == sorted(positions)


def test_the_choice_equals_brute_force_on_a_small_unit():
    """Paragraphs of equal cost: the packer takes the n best that fit, as the best subset of size n does."""
    paras = [f"p{i} " + " ".join(["w"] * 4) for i in range(6)]  # 5 tokens each
    text = "Doc\n" + "\n\n".join(paras)
    scores = [0.3, 0.9, 0.1, 0.8, 0.5, 0.7]
    spans, pos = [], 0
    for p, s in zip(paras, scores):
        a = text.index(p, pos)
        spans.append((a, a + len(p), s))
        pos = a + len(p)
    unit = Unit("u", ["d"], ["Doc"], text, 0, chunk_scores=spans)
    for budget in range(8, 40):
        packed = pack_units([unit], budget, count)
        n = len(packed.read)
        best = max(itertools.combinations(range(6), n), key=lambda c: sum(scores[i] for i in c)) if n else ()
        assert sorted(int(p.paragraph) for p in packed.read) == sorted(best)
        bigger = count(format_unit(Unit("u", ["d"], ["Doc"], "Doc\n" + "\n\n".join(paras[: n + 1]), 0)))
        assert n == 6 or bigger > budget  # one more would not have fitted


def test_the_top_paragraph_is_cut_to_fit_when_nothing_fits_whole():
    text = "Doc\n" + " ".join(["w"] * 50) + "\n\n" + " ".join(["v"] * 40)
    unit = Unit("u", ["d"], ["Doc"], text, 0, chunk_scores=[(4, 4 + 99, 0.9), (105, 105 + 79, 0.1)])
    packed = pack_units([unit], 20, count)
    assert packed.tokens <= 20 and packed.blocks
    assert packed.blocks[0].startswith("Title: Doc\nDoc\nw w")
    assert [p.paragraph for p in packed.read] == [0]


def test_room_left_is_filled_with_the_best_paragraph_left_out_cut():
    text = "Doc\nshort one here\n\n" + " ".join(["w"] * 50)
    spans = [(4, 18, 0.5), (20, 20 + 99, 0.9)]
    unit = Unit("u", ["d"], ["Doc"], text, 0, chunk_scores=spans)
    alone = pack_units([unit], 30, count, min_partial_tokens=100)
    assert [p.paragraph for p in alone.read] == [0]  # 25 tokens left < 100: no partial paragraph
    filled = pack_units([unit], 30, count, min_partial_tokens=8)
    assert sorted(p.paragraph for p in filled.read) == [0, 1] and filled.tokens <= 30
    assert "short one here" in filled.blocks[0] and "w w w" in filled.blocks[0]
    assert filled.blocks[0].index("short one") < filled.blocks[0].index("w w")  # reading order


def test_unscored_units_rank_after_scored_ones():
    u1 = Unit("a", ["d1"], ["A"], "A\none two three", 0, chunk_scores=None)
    u2 = Unit("b", ["d2"], ["B"], "B\nfour five six", 0, chunk_scores=[(2, 15, 0.2)])
    packed = pack_units([u1, u2], 9, count)
    assert [u.unit_id for u in packed.units] == ["b"]
    assert packed.cut[0].unit_id == "a" and packed.cut[0].score is None


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match="budget"):
        pack_units([], 0, count)
