"""Long reader context fitting: whole units in rank order, trimmed units, the prompts within the
window, MixPR compression instead of truncation (scripted LLM)."""

from __future__ import annotations

import random

import pytest

from longrag.config import ReaderConfig
from longrag.llm.base import ContextOverflowError
from longrag.reading.prompts import format_unit
from longrag.reading.reader import LongReader, fit_units
from longrag.types import Unit
from tests.fakes import ScriptedLLM
from tests.longrag.test_reader import make_unit, run, words

# -- context fitting ------------------------------------------------------------------------


def test_fit_keeps_whole_units_in_rank_order():
    units = [make_unit("a", 50), make_unit("b", 200), make_unit("c", 30), make_unit("d", 25)]
    fit = fit_units(units, 100, words, min_partial_tokens=64)
    # a (50) fits, b (200) does not, c (30) fits, d (25) does not (20 left < 25), 20 left < 64: no trimmed fill
    assert fit.unit_ids == ["a", "c"]
    assert fit.blocks == [format_unit(units[0]), format_unit(units[2])]
    assert fit.truncated and fit.trimmed_unit_ids == [] and fit.skipped_unit_ids == ["b", "d"]
    assert fit.tokens == 80


def test_fit_everything_fits():
    units = [make_unit("a", 10), make_unit("b", 20)]
    fit = fit_units(units, 30, words)
    assert fit.unit_ids == ["a", "b"] and not fit.truncated and fit.tokens == 30


def test_fit_trims_top_unit_when_alone_too_large():
    units = [make_unit("a", 300), make_unit("b", 10)]
    fit = fit_units(units, 100, words)
    assert fit.unit_ids == ["a"] and fit.trimmed_unit_ids == ["a"] and fit.truncated
    assert words(fit.blocks[0]) == 100
    assert format_unit(units[0]).startswith(fit.blocks[0])


def test_fit_fills_leftover_room_with_best_skipped_unit_trimmed():
    units = [make_unit("a", 50), make_unit("b", 500), make_unit("c", 30)]
    fit = fit_units(units, 300, words, min_partial_tokens=100)
    # a and c whole (80), then b trimmed into the 220 left; output stays in rank order
    assert fit.unit_ids == ["a", "b", "c"]
    assert fit.trimmed_unit_ids == ["b"] and fit.skipped_unit_ids == []
    assert words(fit.blocks[1]) == 220 and format_unit(units[1]).startswith(fit.blocks[1])
    assert fit.tokens == 300


def test_fit_rejects_nonpositive_budget():
    with pytest.raises(ContextOverflowError, match="no room"):
        fit_units([make_unit("a", 5)], 0, words)


def test_fit_invariants_random():
    rng = random.Random(7)
    for _ in range(200):
        units = [make_unit(f"u{i}", rng.randint(3, 120)) for i in range(rng.randint(1, 8))]
        budget = rng.randint(1, 400)
        fit = fit_units(units, budget, words, min_partial_tokens=40)
        cost = {u.unit_id: words(format_unit(u)) for u in units}
        assert sum(words(b) for b in fit.blocks) <= budget
        assert fit.unit_ids[0] == units[0].unit_id  # the top unit always gets in
        order = [u.unit_id for u in units]
        assert fit.unit_ids == sorted(fit.unit_ids, key=order.index)  # rank order
        # whole units: exactly the greedy choice in rank order
        room, greedy = budget, []
        for u in units:
            if cost[u.unit_id] <= room:
                greedy.append(u.unit_id)
                room -= cost[u.unit_id]
        whole = [uid for uid in fit.unit_ids if uid not in fit.trimmed_unit_ids]
        if units[0].unit_id in fit.trimmed_unit_ids:
            assert cost[units[0].unit_id] > budget and fit.unit_ids == [units[0].unit_id]
        else:
            assert whole == greedy
        assert len(fit.trimmed_unit_ids) <= 1
        assert fit.truncated == (len(fit.unit_ids) < len(units) or bool(fit.trimmed_unit_ids))


def test_reader_prompts_fit_the_window():
    """With a small window the reader trims the top unit; every call stays inside the window
    (ScriptedLLM raises ContextOverflowError otherwise)."""
    cfg = ReaderConfig(context_reserve_tokens=16, long_answer_max_tokens=20, short_answer_max_tokens=5,
                       compression="truncate")
    llm = ScriptedLLM([" ".join(["long"] * 20), "short"], context_window=900)
    units = [make_unit("a", 2000), make_unit("b", 10)]
    reader = LongReader(llm, cfg)
    budget = reader.context_budget("q?")
    assert 0 < budget < 900
    res = run(reader.read("q?", units))
    assert res.units_used == ["a"] and res.truncated and res.context_tokens == budget
    second = llm.calls[1]["messages"]
    assert llm.count_message_tokens(second) + cfg.short_answer_max_tokens <= 900


def test_reader_window_too_small_raises():
    llm = ScriptedLLM(context_window=300)
    with pytest.raises(ContextOverflowError):
        run(LongReader(llm).read("q?", [make_unit("a", 10)]))


# --- compression: MixPR-style selection instead of truncation ---------------------------------
def _big_units(n=3, words=400):
    return [Unit(unit_id=f"u{i}", doc_ids=[str(i)], titles=[f"T{i}"],
                 text=" ".join(f"w{i}_{j}" for j in range(words)), n_tokens=words) for i in range(n)]


def test_compression_mixpr_calls_the_compressor_only_when_units_do_not_fit():
    calls = []

    def compressor(question, blocks, budget, count):
        calls.append((question, len(blocks), budget))
        return "selected sentences"

    llm = ScriptedLLM(["long answer", "short"], context_window=900)
    reader = LongReader(llm, ReaderConfig(compression="mixpr", context_reserve_tokens=16,
                                          long_answer_max_tokens=16, short_answer_max_tokens=8),
                        compressor=compressor)
    fitted = reader.fit("Which?", _big_units())
    assert fitted.compressed and fitted.blocks == ["selected sentences"]
    assert fitted.unit_ids == ["u0", "u1", "u2"] and not fitted.truncated
    assert calls and calls[0][1] == 3 and calls[0][2] == reader.context_budget("Which?")
    # Units that fit whole are never compressed.
    calls.clear()
    small = reader.fit("Which?", _big_units(n=1, words=20))
    assert not small.compressed and not calls
    # Per-request override back to truncation.
    assert not reader.fit("Which?", _big_units(), compression="truncate").compressed


def test_compression_mixpr_without_compressor_uses_question_seeded_mixpr():
    llm = ScriptedLLM(["a", "b"], context_window=900)
    reader = LongReader(llm, ReaderConfig(compression="mixpr", context_reserve_tokens=16,
                                          long_answer_max_tokens=16, short_answer_max_tokens=8))
    units = _big_units()
    fitted = reader.fit("Which?", units)
    assert fitted.compressed and fitted.unit_ids == [u.unit_id for u in units]
    assert 0 < fitted.tokens <= reader.context_budget("Which?")


# --- packing: units that carry their chunks' scores (retrieval.document_order=packed) -------------
def test_reader_packs_units_that_carry_chunk_scores():
    """The reader's context is the best paragraphs of both units within its budget, and the result
    names the paragraphs read and cut; the same units without scores are fitted whole in rank order."""
    filler = " ".join(["filler"] * 300)
    gold1, gold2 = "Alice was born in Paris in 1901 .", "Paris is the capital of France ."
    t1 = f"One\n{filler}\n\n{gold1}"
    t2 = f"Two\n{gold2}\n\n{filler}"
    s1 = [(4, 4 + len(filler), 0.1), (t1.index(gold1), len(t1), 0.9)]
    s2 = [(4, 4 + len(gold2), 0.8), (t2.index(filler), len(t2), 0.2)]
    units = [Unit("u1", ["d1"], ["One"], t1, 310, chunk_scores=s1), Unit("u2", ["d2"], ["Two"], t2, 310, chunk_scores=s2)]
    cfg = ReaderConfig(max_context_tokens=120, long_answer=False)
    llm = ScriptedLLM(["Paris"])
    res = run(LongReader(llm, cfg).read("Where was Alice born?", units))
    assert res.packed and res.context_tokens <= 120
    assert llm.calls[0]["cache_prefix"] is None  # a packed head is this question's own: not a unit to cache
    assert gold1 in res.context and gold2 in res.context and "filler" not in res.context
    assert res.context.index(gold1) < res.context.index(gold2)  # units in rank order
    assert [p["unit_id"] for p in res.paragraphs_read] == ["u1", "u2"]  # best first
    assert {p["unit_id"] for p in res.paragraphs_cut} == {"u1", "u2"} and res.truncated
    plain = [Unit(u.unit_id, u.doc_ids, u.titles, u.text, u.n_tokens) for u in units]
    res2 = run(LongReader(ScriptedLLM(["Paris"]), cfg).read("Where was Alice born?", plain))
    assert not res2.packed and gold1 not in res2.context and res2.paragraphs_read == []
