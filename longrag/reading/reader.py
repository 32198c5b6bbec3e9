"""The long reader (LongRAG, Jiang et al. 2024, Section 3.2): top-ranked long units -> a long answer -> a short answer.

Two turns of one conversation:

1. the units that fit the window (with their titles) and the question -> a few sentences that
   contain the answer (the *long answer*);
2. the same conversation plus the model's reply plus a new user message with worked examples ->
   the *short answer* (a few words), which is then cleaned (:func:`clean_short_answer`) and, when
   the model just repeated a sentence, cut to its answer span (:func:`reduce_to_span`).

Context fitting (:func:`fit_units`) keeps whole units in rank order while they fit the token budget
(the model window minus the prompt's own tokens, both turns' answer budgets and
``reader.context_reserve_tokens``); a unit that does not fit whole is skipped so lower-ranked
smaller units may still get in. Leftover room of at least ``reader.min_partial_unit_tokens`` is
filled with the best skipped unit, trimmed; the top unit always gets in, trimmed to the whole budget
if it alone is too large. ``truncated`` is true when any given unit is missing or trimmed. Base models (``llm.is_chat_model`` False) get the same turns as plain completion prompts.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Callable, Sequence

from longrag.config import ReaderConfig
from longrag.llm.base import LLM, ChatResult, ContextOverflowError
from longrag.reading.prompts import (
    FEW_SHOT_EXAMPLES,
    UNIT_SEPARATOR,
    FewShotExample,
    completion_prompt,
    format_context,
    format_unit,
    turn1_messages,
    turn2_message,
)
from longrag.types import Unit

_WORD_END = re.compile(r"\S+")
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trim_to_tokens(text: str, max_tokens: int, count_tokens: Callable[[str], int]) -> str:
    """The longest whitespace-word prefix of ``text`` with at most ``max_tokens`` tokens
    (binary search over word ends, so it costs O(log words) tokenizer calls)."""
    if max_tokens <= 0:
        return ""
    if count_tokens(text) <= max_tokens:
        return text
    ends = [m.end() for m in _WORD_END.finditer(text)]
    lo, hi = 0, len(ends)  # invariant: prefix of `lo` words fits; of `hi`+1 words... search largest fitting
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(text[: ends[mid - 1]]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[: ends[lo - 1]] if lo else ""


def fit_units(
    units: list[Unit],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    *,
    min_partial_tokens: int = 128,
) -> FittedContext:
    """Choose and format the units that fit ``budget_tokens`` (see module doc for the policy).

    Costs are the formatted blocks' tokens (title line included) plus the separator between
    blocks, counted with the reader model's tokenizer.
    """
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
            trimmed[0] = trim_to_tokens(block, room, count_tokens)
            kept.append(0)
            room -= count_tokens(trimmed[0])
        else:
            skipped.append(i)
    if skipped and not trimmed and room - sep >= min_partial_tokens:
        i = skipped[0]  # nothing else fits whole: the best-ranked skipped unit fills the rest, trimmed
        text = trim_to_tokens(blocks[i], room - sep, count_tokens)
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


_PREFIX = re.compile(
    r"^\s*(?:(?:the\s+)?(?:short\s+|final\s+|long\s+)?answer(?:\s+is\s*:?|\s*[:\-])|a\s*:|output\s*:)\s*",
    re.IGNORECASE,
)
_QUOTES = "\"'`“”‘’«»*_"
_ABBREV_END = re.compile(r"(?:\b[A-Za-z]\.){2,}$|\b(?:Jr|Sr|Inc|Ltd|Co|St|Dr|Mr|Mrs|Ms|etc)\.$")


def clean_short_answer(raw: str) -> str:
    """Reduce a model's short-answer reply to the answer span.

    Takes the first non-empty line, strips "Answer:"-style prefixes, surrounding quotes and
    markdown emphasis, and a trailing period (kept after abbreviations like "U.S.").
    """
    lines = [ln.strip() for ln in raw.replace("\r", "\n").split("\n")]
    text = next((ln for ln in lines if ln and not _PREFIX.fullmatch(ln) and not ln.startswith("Title:")), "")
    if not text:
        # A reply like "Short answer:\nCanberra" has the answer on the next line.
        text = next((ln for ln in lines if ln), "")
    for _ in range(3):
        new = _PREFIX.sub("", text, count=1).strip()
        new = new.strip(_QUOTES).strip()
        if new == text:
            break
        text = new
    # Echoed few-shot structure: cut at a following "Question:"/"Long answer:" marker.
    text = re.split(r"\s*(?:Question|Long answer|Short answer)\s*:", text, maxsplit=1, flags=re.IGNORECASE)[0]
    text = text.strip().strip(_QUOTES).strip()
    while text.endswith((".", ",", ";", ":", "!")) and not _ABBREV_END.search(text):
        text = text[:-1].rstrip()
    return text.strip(_QUOTES).strip()


_STOPWORDS = frozenset(
    "a an the of in on at to for by with and or is are was were be been did does do what which who whom "
    "whose when where why how many much name answer question".split()
)
_COPULA = re.compile(r"\b(?:is|are|was|were)\b:?\s+", re.IGNORECASE)
_CLAUSE_END = re.compile(r",\s|;\s|\.\s|\s\((?!\d)|\s(?:because|which|who|since|as it|and it)\s", re.IGNORECASE)


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOPWORDS}


def reduce_to_span(answer: str, question: str, max_words: int = 6) -> str:
    """Cut a sentence-long "short answer" down to its answer span.

    Small models often repeat their long answer ("The national sport of Zorbland is rowing.")
    instead of extracting from it. When ``answer`` has more than ``max_words`` words this takes
    the part after an explicit ``is:``-style cue, or after the first copula whose left side
    restates the question ("The national sport of Zorbland" -> "rowing"), then keeps the first
    clause. Short answers are returned unchanged.
    """
    if len(answer.split()) <= max_words:
        return answer
    cand = answer
    m = re.search(r":\s+(\S.*)$", cand)
    if m:
        cand = m.group(1)
    q_words = _content_words(question)
    for m in _COPULA.finditer(cand):
        left = _content_words(cand[: m.start()])
        if left and len(left & q_words) >= 0.5 * len(left):
            cand = cand[m.end() :]
            break
    cand = _CLAUSE_END.split(cand + " ", maxsplit=1)[0]
    cand = clean_short_answer(cand)
    return cand or answer


_YES_NO = frozenset({"yes", "no"})


def _normalized(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def short_answer_problem(answer: str, question: str, evidence: str, examples: Sequence[FewShotExample]) -> str | None:
    """Why a short answer cannot be the answer, or None when it may be.

    * ``"empty"``: nothing left after cleaning;
    * ``"question echo"``: the reply restates the question (it ends with "?", or its words cover at
      least 3/4 of the question's content words) -- an entity named in the question, as comparison
      questions need, covers less and passes;
    * ``"few-shot example"``: the reply is one of the worked examples of the prompt rather than an
      answer from this conversation: its content words come from an example more than from the
      ``evidence`` (the long answer and the context), or it is an example's short answer that the
      evidence never mentions. "yes"/"no" are always allowed.
    """
    if not answer.strip():
        return "empty"
    norm = _normalized(answer)
    if norm in _YES_NO:
        return None
    words = _content_words(answer)
    q_words = _content_words(question)
    if answer.rstrip().endswith("?") or (q_words and words <= q_words and len(words) >= 0.75 * len(q_words)):
        return "question echo"
    evidence_norm = f" {_normalized(evidence)} "
    from_evidence = len(words & _content_words(evidence)) / len(words) if words else 0.0
    for ex in examples:
        if norm == _normalized(ex.short_answer) and f" {norm} " not in evidence_norm:
            return "few-shot example"
        if words:
            from_example = len(words & _content_words(f"{ex.question} {ex.long_answer}")) / len(words)
            if from_example >= 0.5 and from_example > from_evidence:
                return "few-shot example"
    return None


_YES_NO_QUESTION = re.compile(
    r"^\s*(?:is|are|was|were|am|do|does|did|can|could|has|have|had|will|would|should|shall|may|might|must)\b",
    re.IGNORECASE,
)
_LEADING_YES_NO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:no|not|never|neither|nor|none|different|n't)\b|n't\b", re.IGNORECASE)


def is_yes_no_question(question: str) -> bool:
    """A question answered by yes or no: it opens with an auxiliary verb ("Are both ...", "Was X
    ...") and offers no alternatives ("Is X or Y older?" asks for one of them)."""
    return bool(_YES_NO_QUESTION.match(question)) and not re.search(r"\bor\b", question, re.IGNORECASE)


def yes_no_answer(question: str, short: str, long_answer: str) -> str | None:
    """"yes"/"no" for a yes/no question: the reply's or the long answer's leading yes/no, else the
    long answer's polarity (a negation -> "no", an affirmation -> "yes"). None for other questions."""
    if not is_yes_no_question(question):
        return None
    for text in (short, long_answer):
        m = _LEADING_YES_NO.match(text)
        if m:
            return m.group(1).lower()
    if not long_answer.strip():
        return None
    return "no" if _NEGATION.search(long_answer) else "yes"


def first_sentence(text: str, max_words: int = 30) -> str:
    """The first sentence of ``text`` (for a fallback answer), at most ``max_words`` words."""
    text = " ".join(text.split())
    m = re.search(r"(?<=[a-z0-9\)\]])[.!?](?=\s|$)", text)
    sent = text[: m.start()] if m else text
    return " ".join(sent.split()[:max_words])


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
        """Tokens left for unit text: window minus both turns' fixed prompt tokens, both answer
        budgets (the long answer appears twice in turn 2: as the reply and quoted), and the reserve;
        capped at ``reader.max_context_tokens``."""
        cfg = self.config
        fixed = self.llm.count_message_tokens(turn1_messages(question, ""))
        fixed += self.llm.count_message_tokens([turn2_message(question, "", cfg.few_shot_examples)])
        answers = 2 * cfg.long_answer_max_tokens + cfg.short_answer_max_tokens
        budget = self.llm.context_window - fixed - answers - cfg.context_reserve_tokens
        return budget if cfg.max_context_tokens is None else min(budget, cfg.max_context_tokens)

    def fit(self, question: str, units: list[Unit], compression: str | None = None) -> FittedContext:
        if not units:
            return FittedContext(blocks=[], unit_ids=[], tokens=0, truncated=False)
        budget = self.context_budget(question)
        fitted = fit_units(
            units, budget, self.llm.count_tokens, min_partial_tokens=self.config.min_partial_unit_tokens
        )
        mode = compression or self.config.compression
        if mode not in ("truncate", "mixpr"):
            raise ValueError(f"compression must be 'truncate' or 'mixpr', got {mode!r}")
        if mode == "truncate" or not fitted.truncated:
            return fitted
        text = self.compressor(question, [format_unit(u) for u in units], budget, self.llm.count_tokens)
        tokens = self.llm.count_tokens(text)
        if tokens > budget:  # never hand the model more than its window
            text = trim_to_tokens(text, budget, self.llm.count_tokens)
            tokens = self.llm.count_tokens(text)
        return FittedContext(blocks=[text], unit_ids=[u.unit_id for u in units], tokens=tokens,
                             truncated=False, compressed=True)

    # -- generation ---------------------------------------------------------------------------

    async def _generate(self, messages: list[dict], *, max_tokens: int, stop: list[str]) -> ChatResult:
        if self.llm.is_chat_model:
            return await self.llm.chat(messages, max_tokens=max_tokens, stop=stop)
        prompt = completion_prompt(messages)
        return await self.llm.complete(prompt, max_tokens=max_tokens, stop=stop + ["\n\n"])

    async def read(self, question: str, units: list[Unit], compression: str | None = None) -> ReaderResult:
        """Answer ``question`` from ``units`` (best first). With no units the model answers from
        the question alone (the context says no documents were found)."""
        question, fitted, context, messages, t_start = self._prepare(question, units, compression)
        t_fit = time.perf_counter()
        first = await self._generate(messages, max_tokens=self.config.long_answer_max_tokens, stop=_TURN1_STOP)
        t_long = time.perf_counter()
        second = await self._generate(self._turn2(question, messages, first), max_tokens=self.config.short_answer_max_tokens,
                                      stop=_TURN2_STOP)
        return self._finish(question, fitted, context, first, second, (t_start, t_fit, t_long, time.perf_counter()))

    async def read_stream(
        self, question: str, units: list[Unit], compression: str | None = None
    ) -> AsyncIterator[str | ReaderResult]:
        """:meth:`read`, streamed: yields the long answer's text deltas (turn 1) as the model
        writes them, then the :class:`ReaderResult`. The short answer (turn 2) is not streamed: it
        is cleaned and checked (:func:`clean_short_answer`, :func:`short_answer_problem`) before
        anyone may see it, and it is a few tokens. A base model (no chat template) is not streamed
        either: its long answer comes as one delta."""
        question, fitted, context, messages, t_start = self._prepare(question, units, compression)
        t_fit = time.perf_counter()
        if self.llm.is_chat_model:
            first = None
            async for item in self.llm.stream_chat(messages, max_tokens=self.config.long_answer_max_tokens,
                                                   stop=_TURN1_STOP):
                if isinstance(item, ChatResult):
                    first = item
                else:
                    yield item
            if first is None:
                raise RuntimeError(f"{self.llm.name}: the stream ended without its ChatResult")
        else:
            first = await self._generate(messages, max_tokens=self.config.long_answer_max_tokens, stop=_TURN1_STOP)
            if first.text:
                yield first.text
        t_long = time.perf_counter()
        second = await self._generate(self._turn2(question, messages, first), max_tokens=self.config.short_answer_max_tokens,
                                      stop=_TURN2_STOP)
        yield self._finish(question, fitted, context, first, second, (t_start, t_fit, t_long, time.perf_counter()))

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

    def _finish(self, question: str, fitted: FittedContext, context: str, first: ChatResult, second: ChatResult,
                times: tuple[float, float, float, float]) -> ReaderResult:
        t_start, t_fit, t_long, t_short = times
        long_answer = first.text.strip()
        examples = FEW_SHOT_EXAMPLES[: self.config.few_shot_examples]
        answer = reduce_to_span(clean_short_answer(second.text), question)
        fallback = short_answer_problem(answer, question, f"{long_answer}\n{context}", examples)
        if fallback is not None:
            # The long answer's first sentence, cut to its answer span.
            answer = reduce_to_span(clean_short_answer(first_sentence(long_answer)), question)
        yes_no = yes_no_answer(question, second.text, long_answer)
        if yes_no is not None and answer.lower() != yes_no:
            answer, fallback = yes_no, fallback or "yes/no question"
        return ReaderResult(
            answer=answer,
            long_answer=long_answer,
            units_used=fitted.unit_ids,
            prompt_tokens=first.prompt_tokens + second.prompt_tokens,
            completion_tokens=first.completion_tokens + second.completion_tokens,
            stages_ms={
                "fit_context": (t_fit - t_start) * 1000.0,
                "long_answer": (t_long - t_fit) * 1000.0,
                "short_answer": (t_short - t_long) * 1000.0,
                "total": (t_short - t_start) * 1000.0,
            },
            truncated=fitted.truncated,
            context_tokens=fitted.tokens,
            compressed=fitted.compressed,
            raw_short_answer=second.text,
            answer_fallback=fallback,
            cached_prompt_tokens=first.cached_prompt_tokens + second.cached_prompt_tokens,
        )
