"""Long reader: conversation shape, few-shot turn, streaming, the direct short answer, preparation off
the event loop (scripted LLM). Context fitting is in test_reader_fit.py, answer cleaning in
test_reader_answers.py."""

from __future__ import annotations

import asyncio

import pytest

from longrag.config import ReaderConfig
from longrag.reading.prompts import FEW_SHOT_EXAMPLES, completion_prompt, format_unit
from longrag.reading.reader import LongReader, ReaderResult, ShortAnswer
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
    llm = ScriptedLLM(["unknown", "I do not know."])  # direct: the short answer first
    res = run(LongReader(llm).read("who?", []))
    assert res.units_used == [] and res.truncated is False and res.answer == "unknown"
    assert "(no documents were found)" in llm.calls[0]["messages"][-1]["content"]


# -- streaming ------------------------------------------------------------------------------


async def _collect(stream):
    return [item async for item in stream]


@pytest.mark.parametrize("is_chat_model", [True, False])
def test_read_stream_sends_the_short_answer_first_then_streams_the_long_answer(is_chat_model):
    """Issue 39: the direct short answer is made first and sent as soon as it is cleaned (a
    ShortAnswer, never token by token); the long answer streams delta by delta after it (base
    models: one delta), and the stream ends with the same ReaderResult that read() returns."""
    script = ['Short answer: "Canberra".', "Canberra is the capital of Australia."]
    units = [Unit("u1", ["d1"], ["Australia"], "Australia's capital is Canberra.", 6)]
    items = run(_collect(LongReader(ScriptedLLM(list(script), is_chat_model=is_chat_model)).read_stream(
        "what is the capital of australia", units)))
    short, *deltas, result = items
    expected = run(LongReader(ScriptedLLM(list(script), is_chat_model=is_chat_model)).read(
        "what is the capital of australia", units))
    assert isinstance(short, ShortAnswer) and short.answer == "Canberra" and short.answer_fallback is None
    assert short.raw_short_answer == script[0] and short.time_to_answer_ms > 0
    assert all(isinstance(d, str) for d in deltas) and "".join(deltas) == script[1]
    assert len(deltas) == (6 if is_chat_model else 1)
    assert isinstance(result, ReaderResult)
    assert (result.answer, result.long_answer, result.units_used, result.prompt_tokens, result.completion_tokens) == (
        expected.answer, expected.long_answer, expected.units_used, expected.prompt_tokens, expected.completion_tokens)
    assert result.answer == short.answer == "Canberra"
    assert 0 < result.time_to_answer_ms <= result.stages_ms["total"]


def test_two_turn_stream_sends_the_short_answer_after_the_long_answer_it_reads():
    script = ["Canberra is the capital of Australia.", "Canberra"]
    units = [Unit("u1", ["d1"], ["Australia"], "Australia's capital is Canberra.", 6)]
    items = run(_collect(LongReader(ScriptedLLM(list(script)), ReaderConfig(answer="two_turn")).read_stream(
        "what is the capital of australia", units)))
    *deltas, short, result = items
    assert "".join(deltas) == script[0] and isinstance(short, ShortAnswer) and short.answer == "Canberra"
    assert isinstance(result, ReaderResult) and result.answer == "Canberra"


# -- the direct short answer (the default) ----------------------------------------------------


def test_direct_answer_is_one_message_over_the_documents_before_the_long_answer():
    llm = ScriptedLLM(["The answer is Canberra.", "Canberra is the capital of Australia."])
    units = [Unit("u1", ["d1"], ["Australia"], "Australia's capital is Canberra.", 6)]
    res = run(LongReader(llm).read("what is the capital of australia", units))
    assert ReaderConfig().answer == "direct" and res.answer == "Canberra" and res.answer_fallback is None
    assert res.long_answer == "Canberra is the capital of Australia."
    short_msgs, long_msgs = llm.calls[0]["messages"], llm.calls[1]["messages"]
    # the short answer's call never sees the long answer: a fresh system + user message
    assert [m["role"] for m in short_msgs] == ["system", "user"]
    assert "Canberra is the capital" not in short_msgs[-1]["content"]
    assert "Title: Australia\nAustralia's capital is Canberra." in short_msgs[-1]["content"]
    assert "Reply with only the answer" in short_msgs[-1]["content"]
    # same system message and the same opening through the documents: a prefix cache reuses them
    assert short_msgs[0] == long_msgs[0]
    docs_end = long_msgs[1]["content"].index("Australia's capital is Canberra.") + len("Australia's capital is Canberra.")
    assert short_msgs[1]["content"][:docs_end] == long_msgs[1]["content"][:docs_end]
    assert llm.calls[0]["max_tokens"] == ReaderConfig().short_answer_max_tokens
    assert llm.calls[1]["max_tokens"] == ReaderConfig().long_answer_max_tokens
    assert res.prompt_tokens == llm.count_message_tokens(long_msgs) + llm.count_message_tokens(short_msgs)


def test_direct_answer_does_not_depend_on_the_long_answer():
    """The same short reply gives the same answer whatever the long answer says, and without one
    (reader.long_answer off, or a request's long_answer=False) a read is a single call."""
    units = [make_unit("a", 12)]
    q = "Were both bands from England?"
    answers = []
    for long_answer in ("No. Only the Beatles were English.", "Yes, both were.", None):
        script = ["yes"] + ([long_answer] if long_answer is not None else [])
        llm = ScriptedLLM(script)
        cfg = ReaderConfig(long_answer=long_answer is not None)
        res = run(LongReader(llm, cfg).read(q, units))
        assert len(llm.calls) == (2 if long_answer is not None else 1)
        answers.append(res.answer)
    assert answers == ["yes", "yes", "yes"]
    # a request overrides reader.long_answer either way
    llm = ScriptedLLM(["yes", "Yes, both were."])
    assert run(LongReader(llm, ReaderConfig(long_answer=True)).read(q, units, long_answer=False)).long_answer == ""
    assert len(llm.calls) == 1
    llm = ScriptedLLM(["yes", "Yes, both were."])
    res = run(LongReader(llm, ReaderConfig(long_answer=False)).read(q, units, long_answer=True))
    assert res.long_answer == "Yes, both were." and len(llm.calls) == 2


def test_direct_answer_without_long_answer_streams_only_the_short_answer_and_result():
    llm = ScriptedLLM(["Canberra"])
    units = [Unit("u1", ["d1"], ["Australia"], "Australia's capital is Canberra.", 6)]
    items = run(_collect(LongReader(llm, ReaderConfig(long_answer=False)).read_stream("capital of australia?", units)))
    assert [type(i) for i in items] == [ShortAnswer, ReaderResult]
    assert items[1].answer == items[0].answer == "Canberra" and items[1].long_answer == "" and len(llm.calls) == 1


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

    async def stream_chat(self, messages, *, max_tokens, temperature=None, stop=None, cache_prefix=None):
        async for item in super().stream_chat(messages, max_tokens=max_tokens, temperature=temperature, stop=stop,
                                              cache_prefix=cache_prefix):
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
