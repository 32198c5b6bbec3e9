"""The long reader (LongRAG, Jiang et al. 2024, Section 3.2): top-ranked long units -> a long answer and a short answer.

1. the units that fit the window (with their titles) and the question -> a few sentences that
   contain the answer (the *long answer*, for the trace and the playground; streamed);
2. the *short answer* (a few words), made as ``reader.answer`` says:

   * ``direct`` (default): one message over the same documents asks for the answer alone
     (:func:`~longrag.reading.prompts.direct_messages`). The long answer never feeds it, so it cannot
     degrade it, and it is made *first*: a stream sends it as soon as it is ready and the long
     answer follows, its call reusing the documents' KV prefix that the short answer's call just
     evaluated. With ``reader.long_answer`` off (or a request's ``long_answer: false``) step 1 is
     skipped and a read is one LLM call.
   * ``two_turn`` (the paper's): the turn-1 conversation plus the model's reply plus a new user
     message (optionally with worked examples) -> the short answer. With small readers this loses
     5-15 EM points to a bare prompt over the same documents: the second turn paraphrases, copies a
     sentence or drifts from the evidence (docs/evaluation.md, "where the points went").

   Either reply is cleaned (:func:`clean_short_answer`) and, when the model wrote a sentence, cut
   to its answer span (:func:`reduce_to_span`); a yes/no question gets yes or no.

Context fitting (:func:`fit_units`) keeps whole units in rank order while they fit the token budget
(the model window minus the prompt's own tokens, both turns' answer budgets and
``reader.context_reserve_tokens``); a unit that does not fit whole is skipped so lower-ranked
smaller units may still get in. Leftover room of at least ``reader.min_partial_unit_tokens`` is
filled with the best skipped unit, trimmed; the top unit always gets in, trimmed to the whole budget
if it alone is too large. ``truncated`` is true when any given unit is missing or trimmed. Units
that carry their chunks' scores (``retrieval.document_order=packed``) are packed instead: their best
paragraphs within the same budget (:mod:`longrag.reading.packing`). Base models (``llm.is_chat_model`` False) get the same turns as plain completion prompts.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from longrag.config import ReaderConfig
from longrag.llm.base import LLM, ChatResult, ContextOverflowError

# The short-answer rules live in longrag.reading.answers; the others stay importable from here.
from longrag.reading.answers import (  # noqa: F401
    clean_short_answer,
    finish_short_answer,
    first_sentence,
    is_yes_no_question,
    reduce_to_span,
    short_answer_problem,
    yes_no_answer,
)
from longrag.reading.packing import pack_units, paragraph_rank
from longrag.reading.prompts import (
    FEW_SHOT_EXAMPLES,
    UNIT_SEPARATOR,
    completion_prompt,
    direct_messages,
    documents_head,
    format_context,
    format_unit,
    turn1_messages,
    turn2_message,
)
from longrag.text.tokens import trim_to_tokens
from longrag.types import Unit

_TURN1_STOP = ["\nQuestion:"]
_TURN2_STOP = ["\nQuestion:", "\nLong answer:", "Long answer:"]


@dataclass
class FittedContext:
    """Which unit texts go to the reader, in rank order."""

    blocks: list[str]
    unit_ids: list[str]
    tokens: int
    truncated: bool
    trimmed_unit_ids: list[str] = field(default_factory=list)
    skipped_unit_ids: list[str] = field(default_factory=list)
    compressed: bool = False
    #: Packed (the units carried their chunks' scores): the paragraphs read and those cut, best first
    #: (:meth:`longrag.reading.packing.PackedParagraph.to_trace`).
    packed: bool = False
    paragraphs_read: list[dict[str, Any]] = field(default_factory=list)
    paragraphs_cut: list[dict[str, Any]] = field(default_factory=list)


# (question, formatted unit blocks in rank order, token budget, token counter) -> context text
Compressor = Callable[[str, list[str], int, Callable[[str], int]], str]


@dataclass
class ReaderResult:
    answer: str
    long_answer: str
    units_used: list[str]
    prompt_tokens: int
    completion_tokens: int
    stages_ms: dict[str, float]
    truncated: bool
    context_tokens: int = 0
    raw_short_answer: str = ""
    compressed: bool = False
    #: Why the short-answer turn's reply was replaced: by a span of the long answer ("empty",
    #: "question echo", "few-shot example"), or by yes/no for a yes/no question ("yes/no question");
    #: None when the reply was used as it was.
    answer_fallback: str | None = None
    #: Prompt tokens the backend took from its prefix cache (the second turn repeats the first).
    cached_prompt_tokens: int = 0
    #: The model that wrote the short answer (the backend's name for it).
    model: str = ""
    #: How the short answer was made: "direct" or "two_turn" (``reader.answer``).
    answer_mode: str = "direct"
    #: The unit text the reader was given, as fitted to its budget (evaluation scores which gold
    #: paragraphs it held: ``reader_paragraph_recall``).
    context: str = ""
    #: Milliseconds from the start of the read to the short answer (``direct``: the answer comes
    #: first and the long answer after it; ``two_turn``: after the long answer, which it reads).
    time_to_answer_ms: float = 0.0
    #: Prompt tokens of the long answer's call that the backend took from its prefix cache: with
    #: ``direct`` the short answer's call evaluated the documents just before, so this is their
    #: shared prefix.
    long_answer_cached_tokens: int = 0
    #: Where the first call found the KV state of the system message and the top unit (llama.cpp's
    #: unit cache): "ram", "disk", "miss", "context" or "" (no cache).
    unit_cache: str = ""
    #: The context was packed from the units' best paragraphs (``retrieval.document_order=packed``):
    #: the paragraphs read and those cut for the budget, best first.
    packed: bool = False
    paragraphs_read: list[dict[str, Any]] = field(default_factory=list)
    paragraphs_cut: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ShortAnswer:
    """What :meth:`LongReader.read_stream` yields as soon as the short answer is ready (cleaned and
    checked: the same ``answer`` as the :class:`ReaderResult` that ends the stream)."""

    answer: str
    raw_short_answer: str
    answer_fallback: str | None
    time_to_answer_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit_units(
    units: list[Unit],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    *,
    min_partial_tokens: int = 128,
    truncate: Callable[[str, int], str] | None = None,
) -> FittedContext:
    """Choose and format the units that fit ``budget_tokens`` (see module doc for the policy).

    Costs are the formatted blocks' tokens (title line included) plus the separator between
    blocks, counted with the reader model's tokenizer. ``truncate(text, n)`` cuts a trimmed unit
    to ``n`` tokens (the reader passes its LLM's ``truncate_tokens``); None searches with
    ``count_tokens`` (:func:`longrag.text.tokens.trim_to_tokens`).
    """
    truncate = truncate or functools.partial(trim_to_tokens, count_tokens=count_tokens)
    if budget_tokens <= 0:
        raise ContextOverflowError(
            f"no room for context: the token budget is {budget_tokens} after the prompt, answers and reserve"
        )
    sep = count_tokens(UNIT_SEPARATOR)
    blocks = [format_unit(u) for u in units]
    room = budget_tokens
    kept: list[int] = []
    skipped: list[int] = []
    trimmed: dict[int, str] = {}
    for i, block in enumerate(blocks):
        extra = count_tokens(block) + (sep if kept else 0)
        if extra <= room:
            kept.append(i)
            room -= extra
        elif i == 0:
            # The top unit always gets in: alone too large, it is trimmed to the whole budget.
            trimmed[0] = truncate(block, room)
            kept.append(0)
            room -= count_tokens(trimmed[0])
        else:
            skipped.append(i)
    if skipped and not trimmed and room - sep >= min_partial_tokens:
        i = skipped[0]  # nothing else fits whole: the best-ranked skipped unit fills the rest, trimmed
        text = truncate(blocks[i], room - sep)
        if text:
            trimmed[i] = text
            kept.append(i)
            room -= count_tokens(text) + sep
    kept.sort()
    out_blocks = [trimmed.get(i, blocks[i]) for i in kept]
    return FittedContext(
        blocks=out_blocks,
        unit_ids=[units[i].unit_id for i in kept],
        tokens=budget_tokens - room,
        truncated=bool(trimmed) or bool(skipped),
        trimmed_unit_ids=[units[i].unit_id for i in sorted(trimmed)],
        skipped_unit_ids=[units[i].unit_id for i in skipped if i not in trimmed],
    )


class LongReader:
    """Two-turn long reader over any :class:`~longrag.llm.base.LLM`."""

    def __init__(self, llm: LLM, config: ReaderConfig | None = None, compressor: Compressor | None = None) -> None:
        """``compressor`` is used when ``config.compression == "mixpr"`` (or a request asks for it)
        and the units do not fit the window whole; None takes question-seeded MixPR with its default
        config (``longrag.reading.longcontext.compress_units_with_mixpr``)."""
        self.llm = llm
        self.config = config or ReaderConfig()
        if compressor is None:
            from longrag.reading.longcontext import compress_units_with_mixpr

            compressor = compress_units_with_mixpr
        self.compressor = compressor

    # -- budget -------------------------------------------------------------------------------

    def context_budget(self, question: str) -> int:
        """Tokens left for unit text: the window minus the fixed prompt tokens, the answer budgets
        and the reserve, capped at ``reader.max_context_tokens``. ``two_turn``: both turns' prompts
        and answers (the long answer appears twice in turn 2: as the reply and quoted); ``direct``:
        the larger of its calls, each with its own answer."""
        cfg = self.config
        if cfg.answer == "two_turn":
            fixed = self.llm.count_message_tokens(turn1_messages(question, ""))
            fixed += self.llm.count_message_tokens([turn2_message(question, "", cfg.few_shot_examples)])
            answers = 2 * cfg.long_answer_max_tokens + cfg.short_answer_max_tokens
        else:  # each call holds the documents once: the larger prompt and its own answer must fit
            fixed = self.llm.count_message_tokens(direct_messages(question, ""))
            answers = cfg.short_answer_max_tokens
            if cfg.long_answer:
                fixed = max(fixed, self.llm.count_message_tokens(turn1_messages(question, "")))
                answers = max(answers, cfg.long_answer_max_tokens)
        budget = self.llm.context_window - fixed - answers - cfg.context_reserve_tokens
        return budget if cfg.max_context_tokens is None else min(budget, cfg.max_context_tokens)

    def fit(self, question: str, units: list[Unit], compression: str | None = None) -> FittedContext:
        if not units:
            return FittedContext(blocks=[], unit_ids=[], tokens=0, truncated=False)
        budget = self.context_budget(question)
        if any(u.chunk_scores is not None for u in units):  # retrieval.document_order=packed
            return self._pack(units, budget)
        fitted = fit_units(
            units, budget, self.llm.count_tokens, min_partial_tokens=self.config.min_partial_unit_tokens,
            truncate=self.llm.truncate_tokens,
        )
        mode = compression or self.config.compression
        if mode not in ("truncate", "mixpr"):
            raise ValueError(f"compression must be 'truncate' or 'mixpr', got {mode!r}")
        if mode == "truncate" or not fitted.truncated:
            return fitted
        text = self.compressor(question, [format_unit(u) for u in units], budget, self.llm.count_tokens)
        tokens = self.llm.count_tokens(text)
        if tokens > budget:  # never hand the model more than its window
            text = self.llm.truncate_tokens(text, budget)
            tokens = self.llm.count_tokens(text)
        return FittedContext(blocks=[text], unit_ids=[u.unit_id for u in units], tokens=tokens,
                             truncated=False, compressed=True)

    def _pack(self, units: list[Unit], budget: int) -> FittedContext:
        packed = pack_units(units, budget, self.llm.count_tokens, truncate=self.llm.truncate_tokens,
                            min_partial_tokens=self.config.min_partial_unit_tokens)
        ranked = sorted(packed.paragraphs, key=paragraph_rank)
        read_ids = [u.unit_id for u in packed.units]
        read_set, cut_units = set(read_ids), {p.unit_id for p in packed.cut}
        return FittedContext(
            blocks=packed.blocks, unit_ids=read_ids, tokens=packed.tokens, truncated=bool(cut_units),
            trimmed_unit_ids=[u for u in read_ids if u in cut_units],
            skipped_unit_ids=[u.unit_id for u in units if u.unit_id not in read_set],
            packed=True, paragraphs_read=[p.to_trace() for p in ranked if p.read],
            paragraphs_cut=[p.to_trace() for p in ranked if not p.read])

    # -- generation ---------------------------------------------------------------------------

    async def _generate(self, messages: list[dict], *, max_tokens: int, stop: list[str],
                        cache_prefix: str | None = None) -> ChatResult:
        if self.llm.is_chat_model:
            return await self.llm.chat(messages, max_tokens=max_tokens, stop=stop, cache_prefix=cache_prefix)
        prompt = completion_prompt(messages)
        return await self.llm.complete(prompt, max_tokens=max_tokens, stop=stop + ["\n\n"])

    def wants_long_answer(self, long_answer: bool | None) -> bool:
        """Whether a read writes the long answer: ``two_turn`` always (its short answer reads it);
        ``direct`` as the request says (``long_answer``), or ``reader.long_answer`` when it says nothing."""
        if self.config.answer == "two_turn":
            return True
        return self.config.long_answer if long_answer is None else bool(long_answer)

    async def read(self, question: str, units: list[Unit], compression: str | None = None,
                   long_answer: bool | None = None) -> ReaderResult:
        """Answer ``question`` from ``units`` (best first). With no units the model answers from
        the question alone (the context says no documents were found). ``long_answer``: write the
        long answer too (None: ``reader.long_answer``; ``two_turn`` always writes it)."""
        result = None
        async for item in self.read_stream(question, units, compression, long_answer, stream_long=False):
            result = item
        assert isinstance(result, ReaderResult)
        return result

    async def read_stream(
        self, question: str, units: list[Unit], compression: str | None = None, long_answer: bool | None = None,
        *, stream_long: bool = True,
    ) -> AsyncIterator[str | ShortAnswer | ReaderResult]:
        """:meth:`read`, streamed: yields a :class:`ShortAnswer` as soon as the short answer is ready,
        the long answer's text deltas as the model writes them, then the :class:`ReaderResult`.

        ``direct`` (the default): the short answer comes first, from one call over the documents, and
        the long answer follows; its call shares the system message and the documents with the short
        answer's, so a backend with a prefix cache evaluates only its own instruction
        (``long_answer_cached_tokens``). ``two_turn``: the short answer is extracted from the long
        answer, so it comes after it. The short answer is never streamed token by token: it is
        cleaned and checked (:func:`clean_short_answer`, :func:`short_answer_problem`) before anyone
        may see it, and it is a few tokens. A base model (no chat template), or ``stream_long``
        False, gives the long answer as one delta."""
        question, fitted, context, messages, t_start = await self._prepare_off_loop(question, units, compression)
        t_fit = time.perf_counter()
        write_long = self.wants_long_answer(long_answer)
        # The top unit's KV state may come from the backend's cache; a packed context's head is this
        # question's own paragraphs, never read again: not cached (a state saved per request, evicting hot units).
        head = None if fitted.packed else documents_head(fitted.blocks)
        first = short = None
        t_short = t_fit
        if self.config.answer == "direct":
            short = await self._generate(direct_messages(question, context), cache_prefix=head,
                                         max_tokens=self.config.short_answer_max_tokens, stop=_TURN1_STOP)
            t_short = time.perf_counter()
            yield self._short_answer(question, context, None, short, t_short - t_start)
        if write_long:
            if stream_long and self.llm.is_chat_model:
                async for item in self.llm.stream_chat(messages, max_tokens=self.config.long_answer_max_tokens,
                                                       stop=_TURN1_STOP, cache_prefix=head):
                    if isinstance(item, ChatResult):
                        first = item
                    else:
                        yield item
                if first is None:
                    raise RuntimeError(f"{self.llm.name}: the stream ended without its ChatResult")
            else:
                first = await self._generate(messages, max_tokens=self.config.long_answer_max_tokens,
                                             stop=_TURN1_STOP, cache_prefix=head)
                if first.text and stream_long:
                    yield first.text
        t_long = time.perf_counter()
        if short is None:  # two_turn: the second turn reads the long answer
            short = await self._generate(self._turn2(question, messages, first),
                                         max_tokens=self.config.short_answer_max_tokens, stop=_TURN2_STOP)
            t_short = time.perf_counter()
            yield self._short_answer(question, context, first, short, t_short - t_start)
        yield self._finish(question, fitted, context, first, short, (t_start, t_fit, t_short, t_long,
                                                                     time.perf_counter()))

    def _short_answer(self, question: str, context: str, first: ChatResult | None, short: ChatResult,
                      elapsed_s: float) -> ShortAnswer:
        answer, fallback = self._clean(question, context, first, short)
        return ShortAnswer(answer, short.text, fallback, elapsed_s * 1000.0)

    def _clean(self, question: str, context: str, first: ChatResult | None, short: ChatResult) -> tuple[str, str | None]:
        if self.config.answer == "two_turn":
            examples = FEW_SHOT_EXAMPLES[: self.config.few_shot_examples]
            long_answer = first.text.strip() if first is not None else ""
            return finish_short_answer(short.text, question, long_answer, context, examples)
        # the long answer never feeds the direct answer: with or without it, the same answer
        return finish_short_answer(short.text, question, "", context)

    async def _prepare_off_loop(self, question: str, units: list[Unit], compression: str | None):
        """:meth:`_prepare` in a worker thread: token counting and MixPR compression are CPU work (and
        a llama.cpp tokenizer waits for the model's lock while another request generates), so on the
        event loop they would stall every other stream of the process."""
        return await asyncio.to_thread(self._prepare, question, units, compression)

    def _prepare(self, question: str, units: list[Unit], compression: str | None):
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question must be a non-empty string")
        if not all(isinstance(u, Unit) for u in units):
            raise ValueError("units must be a list of longrag.types.Unit")
        t_start = time.perf_counter()
        question = " ".join(question.split())
        fitted = self.fit(question, units, compression)
        context = format_context(fitted.blocks)
        return question, fitted, context, turn1_messages(question, context), t_start

    def _turn2(self, question: str, messages: list[dict], first: ChatResult) -> list[dict]:
        long_answer = first.text.strip()
        return messages + [
            {"role": "assistant", "content": long_answer},
            turn2_message(question, long_answer, self.config.few_shot_examples),
        ]

    def _finish(self, question: str, fitted: FittedContext, context: str, first: ChatResult | None,
                second: ChatResult, times: tuple[float, float, float, float, float]) -> ReaderResult:
        t_start, t_fit, t_short, t_long, t_end = times
        long_answer = first.text.strip() if first is not None else ""
        answer, fallback = self._clean(question, context, first, second)
        if self.config.answer == "two_turn":  # long answer, then the short answer from it
            long_ms, short_ms = (t_long - t_fit) * 1000.0, (t_short - t_long) * 1000.0
        else:  # the short answer, then the long answer
            short_ms, long_ms = (t_short - t_fit) * 1000.0, (t_long - t_short) * 1000.0
        calls = [c for c in (first, second) if c is not None]
        return ReaderResult(
            answer=answer,
            long_answer=long_answer,
            units_used=fitted.unit_ids,
            prompt_tokens=sum(c.prompt_tokens for c in calls),
            completion_tokens=sum(c.completion_tokens for c in calls),
            stages_ms={
                "fit_context": (t_fit - t_start) * 1000.0,
                "long_answer": long_ms,
                "short_answer": short_ms,
                "total": (t_end - t_start) * 1000.0,
            },
            truncated=fitted.truncated,
            context_tokens=fitted.tokens,
            compressed=fitted.compressed,
            raw_short_answer=second.text,
            answer_fallback=fallback,
            cached_prompt_tokens=sum(c.cached_prompt_tokens for c in calls),
            model=second.model,
            answer_mode=self.config.answer,
            context=context,
            time_to_answer_ms=(t_short - t_start) * 1000.0,
            long_answer_cached_tokens=first.cached_prompt_tokens if first is not None else 0,
            unit_cache=(first if self.config.answer == "two_turn" else second).prefix_cache,
            packed=fitted.packed,
            paragraphs_read=fitted.paragraphs_read,
            paragraphs_cut=fitted.paragraphs_cut,
        )
