"""Long reader answer cleaning: short-answer cleanup and span reduction, the short-answer guard,
yes/no answers, the context budget cap (scripted LLM)."""

from __future__ import annotations

import pytest

from longrag.config import ReaderConfig
from longrag.reading.prompts import FEW_SHOT_EXAMPLES
from longrag.reading.reader import (
    LongReader,
    clean_short_answer,
    first_sentence,
    reduce_to_span,
    short_answer_problem,
    yes_no_answer,
)
from longrag.types import Unit
from tests.fakes import ScriptedLLM
from tests.longrag.test_reader import TWO_TURN, make_unit, run

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
    llm = ScriptedLLM(["George Orwell", "Animal Farm was written by George Orwell."])  # short answer first
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
