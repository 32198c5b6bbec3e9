"""Long reader: conversation shape, few-shot turn, context fitting, answer cleaning (scripted LLM)."""

from __future__ import annotations

import asyncio
import random

import pytest

from longrag.config import ReaderConfig
from longrag.llm.base import ContextOverflowError
from longrag.reading.prompts import FEW_SHOT_EXAMPLES, completion_prompt, format_unit
from longrag.reading.reader import (
    LongReader,
    ReaderResult,
    clean_short_answer,
    first_sentence,
    fit_units,
    reduce_to_span,
    short_answer_problem,
    trim_to_tokens,
    yes_no_answer,
)
from longrag.types import Unit
from tests.fakes import ScriptedLLM


def words(text: str) -> int:
    return len(text.split())


def make_unit(uid: str, n_words: int, title: str | None = None) -> Unit:
    """A unit whose formatted block ("Title: <title>\\n<text>") has exactly n_words words."""
    title = title or f"Doc{uid}"
    body = " ".join(f"{uid}w{i}" for i in range(n_words - 2))  # "Title:" + title take 2 words
    u = Unit(unit_id=uid, doc_ids=[uid], titles=[title], text=body, n_tokens=n_words)
    assert words(format_unit(u)) == n_words
    return u


def run(coro):
    return asyncio.run(coro)


#: The paper's two turns (``reader.answer=two_turn``); the default is the direct short answer.
TWO_TURN = ReaderConfig(answer="two_turn")


# -- the two turns --------------------------------------------------------------------------


def test_turn2_carries_turn1_conversation():
    llm = ScriptedLLM(["Canberra is the capital of Australia.", 'Short answer: "Canberra".'])
    reader = LongReader(llm, TWO_TURN)
    units = [
        Unit("u1", ["d1"], ["Australia"], "Australia's capital is Canberra. Sydney is its largest city.", 10),
        Unit("u2", ["d2"], ["Sydney"], "Sydney hosts the Opera House.", 5),
    ]
    res = run(reader.read("what is the capital of australia", units))

    assert res.answer == "Canberra"
    assert res.long_answer == "Canberra is the capital of Australia."
    assert res.units_used == ["u1", "u2"] and res.truncated is False
    assert len(llm.calls) == 2
    first, second = llm.calls[0]["messages"], llm.calls[1]["messages"]
    assert first[0]["role"] == "system" and first[-1]["role"] == "user"
    # turn 1: units with their titles, in rank order, and the question
    t1 = first[-1]["content"]
    assert "Title: Australia\nAustralia's capital is Canberra." in t1
    assert t1.index("Title: Australia") < t1.index("Title: Sydney")
    assert t1.count("what is the capital of australia") >= 1
    # turn 2 = turn 1 messages + the model's reply + one new user message
    assert second[: len(first)] == first
    assert second[len(first)] == {"role": "assistant", "content": "Canberra is the capital of Australia."}
    assert len(second) == len(first) + 2 and second[-1]["role"] == "user"
    t2 = second[-1]["content"]
    assert t2.rstrip().endswith(
        "Question: what is the capital of australia\nLong answer: Canberra is the capital of Australia.\nShort answer:"
    )
    # budgets and token accounting
    assert llm.calls[0]["max_tokens"] == ReaderConfig().long_answer_max_tokens
    assert llm.calls[1]["max_tokens"] == ReaderConfig().short_answer_max_tokens
    assert res.prompt_tokens == llm.count_message_tokens(first) + llm.count_message_tokens(second)
    assert res.completion_tokens == words("Canberra is the capital of Australia.") + words('Short answer: "Canberra".')
    assert set(res.stages_ms) == {"fit_context", "long_answer", "short_answer", "total"}
    assert res.stages_ms["total"] >= res.stages_ms["long_answer"] >= 0


@pytest.mark.parametrize("n", [0, 3, 8])
def test_few_shot_examples_present(n):
    llm = ScriptedLLM(["Paris is the capital.", "Paris"])
    run(LongReader(llm, ReaderConfig(answer="two_turn", few_shot_examples=n)).read("capital of france?", [make_unit("a", 20)]))
    t2 = llm.calls[1]["messages"][-1]["content"]
    assert t2.count("Short answer:") == n + 1
    for ex in FEW_SHOT_EXAMPLES[:n]:
        assert f"Question: {ex.question}\nLong answer: {ex.long_answer}\nShort answer: {ex.short_answer}" in t2
    for ex in FEW_SHOT_EXAMPLES[n:]:
        assert ex.question not in t2
    # the real question comes after every example
    assert t2.rindex("capital of france?") > max([t2.index(ex.question) for ex in FEW_SHOT_EXAMPLES[:n]] or [-1])


def test_empty_short_answer_falls_back_to_long_answer():
    llm = ScriptedLLM(["The Nile flows through Cairo. It is long.", "  \n "])
    res = run(LongReader(llm, TWO_TURN).read("which river flows through cairo", [make_unit("a", 10)]))
    assert res.answer == "The Nile flows through Cairo"


def test_base_model_uses_completion_prompts():
    llm = ScriptedLLM(["Ohio, because he was born in Cincinnati.", " Ohio\nQuestion: next"], is_chat_model=False)
    res = run(LongReader(llm, TWO_TURN).read("where was spielberg born", [make_unit("a", 12)]))
    assert [c["kind"] for c in llm.calls] == ["complete", "complete"]
    p1, p2 = llm.calls[0]["prompt"], llm.calls[1]["prompt"]
    assert p1.endswith("\nAnswer:") and p2.endswith("Short answer:")
    assert p2.startswith(p1) and "Ohio, because he was born in Cincinnati." in p2[len(p1) :]
    assert res.answer == "Ohio"


def test_completion_prompt_flattening():
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2 Short answer:"},
    ]
    assert completion_prompt(msgs) == "S\n\nQ1\nAnswer: A1\n\nQ2 Short answer:"


def test_question_must_be_text():
    with pytest.raises(ValueError, match="question"):
        run(LongReader(ScriptedLLM()).read("   ", [make_unit("a", 5)]))


def test_no_units_still_answers():
    llm = ScriptedLLM(["I do not know.", "unknown"])
    res = run(LongReader(llm).read("who?", []))
    assert res.units_used == [] and res.truncated is False and res.answer == "unknown"
    assert "(no documents were found)" in llm.calls[0]["messages"][-1]["content"]


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


# -- post-processing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("Canberra", "Canberra"),
        ("Canberra.", "Canberra"),
        ('"Canberra"', "Canberra"),
        ("Short answer: Canberra.", "Canberra"),
        ("Answer: 'the Nile'", "the Nile"),
        ("The answer is: 9 November 1989.", "9 November 1989"),
        ("**Mary Shelley**", "Mary Shelley"),
        ("  \n\nShort answer:\nOhio\n", "Ohio"),
        ("Ohio\nQuestion: who wrote hamlet\nLong answer: ...", "Ohio"),
        ("Ohio Question: who wrote hamlet", "Ohio"),
        ("Washington, D.C.", "Washington, D.C."),
        ("the U.S.", "the U.S."),
        ("“Pride and Prejudice”.", "Pride and Prejudice"),
        ("yes.", "yes"),
        ("the answer is Canberra", "Canberra"),
        ("Answer Records", "Answer Records"),
        ("", ""),
    ],
)
def test_clean_short_answer(raw, expected):
    assert clean_short_answer(raw) == expected


def test_first_sentence():
    assert first_sentence("The Nile flows north. It is long.") == "The Nile flows north"
    assert first_sentence("Born in 1946 in Ohio.") == "Born in 1946 in Ohio"
    assert first_sentence(" ".join(["w"] * 50), max_words=5) == "w w w w w"


def test_trim_to_tokens_is_longest_fitting_prefix():
    text = "alpha  beta\ngamma delta epsilon"
    assert trim_to_tokens(text, 10, words) == text
    assert trim_to_tokens(text, 3, words) == "alpha  beta\ngamma"
    assert trim_to_tokens(text, 0, words) == ""
    # a counter where tokens are characters: the prefix is the longest word prefix within budget
    out = trim_to_tokens(text, 12, len)
    assert out == "alpha  beta" and len(out) <= 12 and len("alpha  beta\ngamma") > 12


@pytest.mark.parametrize(
    "answer,question,expected",
    [
        ("The national sport of Zorbland is rowing", "What is the national sport of Zorbland?", "rowing"),
        ('The answer to the question "How many people live in Velmora?" is: 80,000', "How many people live in Velmora?", "80,000"),
        ("The capital of Australia is Canberra, chosen as a compromise", "what is the capital of australia", "Canberra"),
        ("Yes. The Beatles formed in Liverpool and the Stones in London", "are both bands from england", "Yes"),
        ("Mary Shelley", "who wrote frankenstein", "Mary Shelley"),  # already short: unchanged
        ("Canberra is the capital city of the country of Australia", "what is the capital of australia", "Canberra is the capital city of the country of Australia"),
    ],
)
def test_reduce_to_span(answer, question, expected):
    assert reduce_to_span(answer, question) == expected


def test_reader_reduces_a_repeated_sentence():
    llm = ScriptedLLM(["The national sport of Zorbland is rowing.", "The national sport of Zorbland is rowing."])
    res = run(LongReader(llm).read("What is the national sport of Zorbland?", [make_unit("a", 10)]))
    assert res.answer == "rowing"
    assert res.raw_short_answer == "The national sport of Zorbland is rowing."


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


# -- the short-answer guard -------------------------------------------------------------------

BEATLES_LEAK = "The Beatles were born in Liverpool and the Rolling Stones were born in London"
ORWELL_EVIDENCE = "Animal Farm is a novella by George Orwell, first published in England in 1945."


@pytest.mark.parametrize(
    "answer, question, evidence, problem",
    [
        ("George Orwell", "Who wrote the novel Animal Farm?", ORWELL_EVIDENCE, None),
        (BEATLES_LEAK, "Who wrote the novel Animal Farm?", ORWELL_EVIDENCE, "few-shot example"),
        # an example's short answer that this conversation never mentions
        ("Canberra", "Who wrote the novel Animal Farm?", ORWELL_EVIDENCE, "few-shot example"),
        # ... and the same words when the evidence does say them: a real answer
        ("Canberra", "What is the capital of Australia?", "Canberra is the capital of Australia.", None),
        ("yes", "Are the Beatles and the Rolling Stones both from England?", "Both are English bands.", None),
        ("Which spaceflight first landed humans on the Moon?",
         "Which spaceflight first landed humans on the Moon?", "Apollo 11 landed on the Moon.", "question echo"),
        ("spaceflight first landed humans on Moon", "Which spaceflight first landed humans on the Moon?",
         "Apollo 11 landed on the Moon.", "question echo"),
        # comparison questions are answered by an entity of the question: allowed
        ("Arthur's Magazine", "Which magazine was started first, Arthur's Magazine or First for Women?",
         "Arthur's Magazine was started in 1844.", None),
        ("", "Who wrote the novel Animal Farm?", ORWELL_EVIDENCE, "empty"),
    ],
)
def test_short_answer_problem(answer, question, evidence, problem):
    assert short_answer_problem(answer, question, evidence, FEW_SHOT_EXAMPLES) == problem


def test_short_answer_problem_only_checks_the_examples_in_the_prompt():
    # with no examples in the prompt, an example's answer cannot have leaked from it
    assert short_answer_problem(BEATLES_LEAK, "Who wrote Animal Farm?", ORWELL_EVIDENCE, ()) is None


@pytest.mark.parametrize(
    "reply, reason",
    [(BEATLES_LEAK, "few-shot example"), ("Who wrote the novel Animal Farm?", "question echo"), ("", "empty")],
)
def test_reader_replaces_a_bad_short_answer_with_the_long_answer_span(reply, reason):
    long_answer = "Animal Farm was written by George Orwell. It was published in 1945."
    llm = ScriptedLLM([long_answer, reply])
    unit = Unit("u1", ["d1"], ["Animal Farm"], ORWELL_EVIDENCE, 20)
    # eight worked examples in the prompt: the Beatles example can leak
    res = run(LongReader(llm, ReaderConfig(answer="two_turn", few_shot_examples=8)).read("Who wrote the novel Animal Farm?", [unit]))
    assert res.answer_fallback == reason
    assert res.raw_short_answer == reply
    assert "George Orwell" in res.answer and "Beatles" not in res.answer and "1945" not in res.answer


def test_reader_keeps_a_good_short_answer_and_says_so():
    llm = ScriptedLLM(["Animal Farm was written by George Orwell.", "George Orwell"])
    unit = Unit("u1", ["d1"], ["Animal Farm"], ORWELL_EVIDENCE, 20)
    res = run(LongReader(llm, ReaderConfig()).read("Who wrote the novel Animal Farm?", [unit]))
    assert res.answer == "George Orwell" and res.answer_fallback is None


def test_max_context_tokens_caps_the_budget():
    llm = ScriptedLLM(["x", "x"])
    wide = LongReader(llm, ReaderConfig())
    capped = LongReader(llm, ReaderConfig(max_context_tokens=50, compression="truncate"))
    assert wide.context_budget("q?") > 50 and capped.context_budget("q?") == 50
    units = [make_unit(f"u{i}", 30) for i in range(4)]
    fitted = capped.fit("q?", units)
    assert fitted.unit_ids == ["u0"] and fitted.tokens <= 50 and fitted.truncated


@pytest.mark.parametrize(
    "question, short, long_answer, expected",
    [
        ("Are Christopher Nolan and Sathish Kalathil both film directors?", "Christopher Nolan and Sathish",
         "Christopher Nolan and Sathish Kalathil are both film directors.", "yes"),
        ("Are Watertown and Alexandria airports in the same state?", "Yes, both are airports in the same state",
         "Yes, both are in the same state.", "yes"),
        ("Were both bands from England?", "The Beatles", "No. Only the Beatles were English.", "no"),
        ("Is Lake Tahoe in Nevada and California?", "", "Lake Tahoe is not only in Nevada.", "no"),
        ("Did they have different nationalities?", "", "They didn't share one: they had different nationalities.",
         "no"),
        # choices and open questions are not yes/no questions
        ("Is the Nile or the Amazon longer?", "the Nile", "The Nile is longer.", None),
        ("Who directed Jaws?", "Steven Spielberg", "Jaws was directed by Steven Spielberg.", None),
    ],
)
def test_yes_no_answer(question, short, long_answer, expected):
    assert yes_no_answer(question, short, long_answer) == expected


def test_reader_answers_yes_no_questions_with_yes_or_no():
    llm = ScriptedLLM(["Yes, both were film directors.", "Christopher Nolan and Sathish Kalathil"])
    res = run(LongReader(llm, TWO_TURN).read("Are Christopher Nolan and Sathish Kalathil both film directors?",
                                   [make_unit("a", 10)]))
    assert res.answer == "yes" and res.answer_fallback == "yes/no question"


# -- streaming ------------------------------------------------------------------------------


async def _collect(stream):
    return [item async for item in stream]


@pytest.mark.parametrize("is_chat_model", [True, False])
def test_read_stream_streams_the_long_answer_then_gives_what_read_gives(is_chat_model):
    """Turn 1 (the long answer) streams delta by delta; turn 2 is cleaned before it is shown, so
    the stream ends with the same ReaderResult that read() returns (base models: one delta)."""
    script = ["Canberra is the capital of Australia.", 'Short answer: "Canberra".']
    units = [Unit("u1", ["d1"], ["Australia"], "Australia's capital is Canberra.", 6)]
    items = run(_collect(LongReader(ScriptedLLM(list(script), is_chat_model=is_chat_model)).read_stream(
        "what is the capital of australia", units)))
    *deltas, result = items
    expected = run(LongReader(ScriptedLLM(list(script), is_chat_model=is_chat_model)).read(
        "what is the capital of australia", units))
    assert all(isinstance(d, str) for d in deltas) and "".join(deltas) == script[0]
    assert len(deltas) == (6 if is_chat_model else 1)
    assert isinstance(result, ReaderResult)
    assert (result.answer, result.long_answer, result.units_used, result.prompt_tokens, result.completion_tokens) == (
        expected.answer, expected.long_answer, expected.units_used, expected.prompt_tokens, expected.completion_tokens)
    assert result.answer == "Canberra"


# -- the direct short answer (the default) ----------------------------------------------------


def test_direct_answer_is_one_message_over_the_documents_beside_the_long_answer():
    llm = ScriptedLLM(["Canberra is the capital of Australia.", "The answer is Canberra."])
    units = [Unit("u1", ["d1"], ["Australia"], "Australia's capital is Canberra.", 6)]
    res = run(LongReader(llm).read("what is the capital of australia", units))
    assert ReaderConfig().answer == "direct" and res.answer == "Canberra" and res.answer_fallback is None
    assert res.long_answer == "Canberra is the capital of Australia."
    long_msgs, short_msgs = llm.calls[0]["messages"], llm.calls[1]["messages"]
    # the short answer's call never sees the long answer: a fresh system + user message
    assert [m["role"] for m in short_msgs] == ["system", "user"]
    assert "Canberra is the capital" not in short_msgs[-1]["content"]
    assert "Title: Australia\nAustralia's capital is Canberra." in short_msgs[-1]["content"]
    assert "Reply with only the answer" in short_msgs[-1]["content"]
    # same system message and the same opening through the documents: a prefix cache reuses them
    assert short_msgs[0] == long_msgs[0]
    docs_end = long_msgs[1]["content"].index("Australia's capital is Canberra.") + len("Australia's capital is Canberra.")
    assert short_msgs[1]["content"][:docs_end] == long_msgs[1]["content"][:docs_end]
    assert llm.calls[1]["max_tokens"] == ReaderConfig().short_answer_max_tokens
    assert res.prompt_tokens == llm.count_message_tokens(long_msgs) + llm.count_message_tokens(short_msgs)


def test_direct_answer_does_not_depend_on_the_long_answer():
    """The same short reply gives the same answer whatever the long answer says, and without one
    (reader.long_answer off) a read is a single call."""
    units = [make_unit("a", 12)]
    q = "Were both bands from England?"
    answers = []
    for long_answer in ("No. Only the Beatles were English.", "Yes, both were.", None):
        script = ([long_answer] if long_answer is not None else []) + ["yes"]
        llm = ScriptedLLM(script)
        cfg = ReaderConfig(long_answer=long_answer is not None)
        res = run(LongReader(llm, cfg).read(q, units))
        assert len(llm.calls) == (2 if long_answer is not None else 1)
        answers.append(res.answer)
    assert answers == ["yes", "yes", "yes"]


def test_direct_answer_without_long_answer_streams_only_the_result():
    llm = ScriptedLLM(["Canberra"])
    units = [Unit("u1", ["d1"], ["Australia"], "Australia's capital is Canberra.", 6)]
    items = run(_collect(LongReader(llm, ReaderConfig(long_answer=False)).read_stream("capital of australia?", units)))
    assert len(items) == 1 and isinstance(items[0], ReaderResult)
    assert items[0].answer == "Canberra" and items[0].long_answer == "" and len(llm.calls) == 1


@pytest.mark.parametrize("raw, expected", [
    ("Answer: George Orwell.", "George Orwell"),
    ('"George Orwell"\nHe wrote it in 1945.', "George Orwell"),
])
def test_direct_answer_is_cleaned(raw, expected):
    res = run(LongReader(ScriptedLLM([raw]), ReaderConfig(long_answer=False)).read(
        "Who wrote Animal Farm?", [make_unit("a", 10)]))
    assert res.answer == expected


def test_direct_budget_counts_each_call_once():
    """Two turns hold the long answer twice and both prompts; direct calls each hold the documents
    once, so the same window leaves more room for them."""
    llm = ScriptedLLM(context_window=2000)
    direct = LongReader(llm, ReaderConfig(max_context_tokens=None)).context_budget("q?")
    two = LongReader(llm, ReaderConfig(max_context_tokens=None, answer="two_turn")).context_budget("q?")
    assert direct > two


# -- preparation off the event loop ----------------------------------------------------------


class _SlowCountingLLM(ScriptedLLM):
    """Counting tokens takes ``delay_s`` of CPU (a long MixPR preparation); a stream yields a word
    every 10 ms and the test records when each arrived."""

    def __init__(self, delay_s: float, **kw) -> None:
        super().__init__(default=" ".join(f"w{i}" for i in range(60)), **kw)
        self.delay_s, self.slow_calls = delay_s, 0

    def count_tokens(self, text: str) -> int:
        if self.slow_calls > 0:
            import time

            self.slow_calls -= 1
            time.sleep(self.delay_s)  # blocks the thread it runs on, as CPU work does
        return super().count_tokens(text)

    async def stream_chat(self, messages, *, max_tokens, temperature=None, stop=None):
        async for item in super().stream_chat(messages, max_tokens=max_tokens, temperature=temperature, stop=stop):
            await asyncio.sleep(0.01)
            yield item


def test_a_stream_keeps_flowing_while_another_request_is_prepared():
    llm = _SlowCountingLLM(0.3)
    reader = LongReader(llm, ReaderConfig(long_answer_max_tokens=64))
    units = [make_unit("u1", 50)]

    async def scenario():
        loop = asyncio.get_running_loop()
        arrivals: list[float] = []

        async def stream():
            async for item in reader.read_stream("first question", units):
                if isinstance(item, str):
                    arrivals.append(loop.time())
                    if len(arrivals) == 5:
                        llm.slow_calls = 3  # the second request's preparation: three slow counts
                        started.set()

        started = asyncio.Event()
        first = asyncio.create_task(stream())
        await started.wait()
        await reader.read("second question", units)  # its preparation: 0.3 s token counts
        await first
        return arrivals

    arrivals = run(scenario())
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(arrivals) == 60 and max(gaps) < 0.25, f"the stream stalled for {max(gaps):.2f} s"
