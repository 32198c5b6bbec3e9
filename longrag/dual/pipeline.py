"""Extractor, CoT-guided filter and generator of dual-perspective LongRAG, and its five strategies.

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024):

- Extractor (Section 4.2): the retrieved chunks are mapped back to their source paragraphs (several
  chunks of one paragraph keep only the best-scored one), and the LLM writes the *global information*
  the question needs from those paragraphs.
- CoT-guided filter (Section 4.3): one chain-of-thought call over the question and all chunks, then
  one True/False judgement per chunk guided by that CoT (JSON ``{"status": bool}``, constrained where
  the backend supports it), run concurrently. If no chunk is kept, all are kept and the trace says so.
- Generator (Section 4.4): answers from the global information plus the kept chunks.
- Strategies (Section 5.3): R&B (chunks), R&L (the chunks' source paragraphs), Ext (global
  information + chunks), Fil (kept chunks), E&F (global information + kept chunks).

Every stage is traced with its calls, tokens and latency; the result also records the generator's
input tokens (the paper's Figure 3). This module holds the stages and the strategies' runner; the
prompts are in :mod:`longrag.dual.prompts`, the traces and results in :mod:`longrag.dual.records`,
the chunk index and the chunk -> paragraph mapping in :mod:`longrag.dual.paragraphs`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from longrag.config import DUAL_STRATEGIES, DualConfig
from longrag.dual.chunking import SourceParagraph
from longrag.dual.paragraphs import ChunkIndex, map_to_paragraphs
from longrag.dual.prompts import (
    COT_PROMPT,
    DETAILS_HEADER,
    EXTRACTOR_PROMPT,
    GENERATOR_PROMPT,
    GLOBAL_HEADER,
    JUDGE_PROMPT,
    JUDGEMENT_SCHEMA,
    SYSTEM,
    parse_judgement,
)
from longrag.dual.records import DualResult, Judgement, StageTrace
from longrag.dual.rerank import ChunkRetrieval, RetrievedChunk
from longrag.llm.base import LLM, ChatResult
from longrag.reading.answers import finish_short_answer
from longrag.types import InvalidRequest

__all__ = [
    "STRATEGIES",
    "DualPipeline",
    "ExtractorStage",
    "FilterStage",
    "GeneratorStage",
    "check_strategy",
]

STRATEGIES: tuple[str, ...] = DUAL_STRATEGIES
USES_EXTRACTOR = frozenset({"Ext", "E&F"})
USES_FILTER = frozenset({"Fil", "E&F"})
_SEP = "\n\n"


def check_strategy(strategy: Any) -> str:
    if strategy not in STRATEGIES:
        raise InvalidRequest(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    return strategy


# -------------------------------------------------------------------------------------------- pipeline


class ExtractorStage(Protocol):
    async def extract(
        self, question: str, chunks: Sequence[RetrievedChunk], paragraphs: Mapping[str, SourceParagraph]
    ) -> tuple[str, list[str], StageTrace]: ...


class FilterStage(Protocol):
    async def filter(
        self, question: str, chunks: Sequence[RetrievedChunk]
    ) -> tuple[list[RetrievedChunk], str, list[Judgement], StageTrace]: ...


class GeneratorStage(Protocol):
    async def generate(
        self, question: str, details: Sequence[str], global_information: str | None = None
    ) -> tuple[str, int, StageTrace]: ...


class DualPipeline:
    """Runs strategies over retrieved chunks. By default every stage is this object's own method
    with one LLM; ``extractor``, ``filter`` and ``generator`` put any stage elsewhere (another
    ``DualPipeline`` with another model, or a remote deployment with the same method), which is how
    the paper pairs small extractor/filter models with a stronger generator (Section 5.4)."""

    def __init__(
        self,
        llm: LLM | None,
        config: DualConfig | None = None,
        *,
        extractor: ExtractorStage | None = None,
        filter: FilterStage | None = None,  # noqa: A002 - the paper's name for the stage
        generator: GeneratorStage | None = None,
    ):
        if llm is None and None in (extractor, filter, generator):
            raise ValueError("DualPipeline needs an llm unless extractor, filter and generator are all given")
        self.llm = llm
        self.config = config or DualConfig()
        self.stages: tuple[ExtractorStage, FilterStage, GeneratorStage] = (
            extractor or self, filter or self, generator or self
        )  # fmt: skip

    # -- LLM plumbing ---------------------------------------------------------------------------

    def _messages(self, user: str) -> list[dict]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]

    async def _ask(self, user: str, max_tokens: int, schema: dict | None = None) -> ChatResult:
        if not self.llm.is_chat_model:
            return await self.llm.complete(SYSTEM + "\n\n" + user + "\n", max_tokens=max_tokens)
        if schema is not None:
            return await self.llm.chat_json(self._messages(user), schema=schema, max_tokens=max_tokens)
        return await self.llm.chat(self._messages(user), max_tokens=max_tokens)

    def _fit(self, template: str, texts: list[str], max_tokens: int, notes: list[str], what: str, **fmt: str) -> str:
        """Join ``texts`` into ``template``'s ``{content}``, dropping trailing texts (and cutting the
        last one at a word boundary) so the prompt fits the window; says so in ``notes``."""
        llm, reserve = self.llm, self.config.context_reserve_tokens
        fixed = llm.count_message_tokens(self._messages(template.format(content="", **fmt)))
        budget = llm.context_window - max_tokens - reserve - fixed
        kept: list[str] = []
        used = 0
        for i, t in enumerate(texts):
            cost = llm.count_tokens(t + _SEP)
            if used + cost <= budget:
                kept.append(t)
                used += cost
                continue
            room = budget - used
            if room > 32:
                words = t.split()
                n = max(1, int(len(words) * room / max(cost, 1)) - 2)
                while n > 1 and llm.count_tokens(" ".join(words[:n]) + _SEP) > room:
                    n = int(n * 0.9)
                kept.append(" ".join(words[:n]))
            notes.append(f"{what}: {len(texts) - i} of {len(texts)} texts cut or dropped to fit the context window")
            break
        if not kept:
            raise ValueError(f"{what}: the window of {llm.context_window} tokens leaves no room for any context")
        return template.format(content=_SEP.join(kept), **fmt)

    # -- stages -----------------------------------------------------------------------------------

    async def extract(
        self, question: str, chunks: Sequence[RetrievedChunk], paragraphs: Mapping[str, SourceParagraph]
    ) -> tuple[str, list[str], StageTrace]:
        """Section 4.2: chunks -> source paragraphs -> global information."""
        t0 = time.perf_counter()
        st = StageTrace("extractor")
        mapped = map_to_paragraphs(chunks, paragraphs)
        st.notes.append(f"{len(chunks)} chunks -> {len(mapped)} source paragraphs")
        texts = [_titled(p) for p, _ in mapped]
        max_t = self.config.extractor_max_tokens
        prompt = self._fit(EXTRACTOR_PROMPT, texts, max_t, st.notes, "extractor", question=question)
        r = await self._ask(prompt, max_t)
        st.add(r)
        st.wall_ms = _ms(t0)
        return r.text.strip(), [p.id for p, _ in mapped], st

    async def filter(
        self, question: str, chunks: Sequence[RetrievedChunk]
    ) -> tuple[list[RetrievedChunk], str, list[Judgement], StageTrace]:
        """Section 4.3: one CoT call over all chunks, then concurrent per-chunk judgements. Chunks
        whose judgement cannot be parsed are kept (never drop evidence on a garbled reply); if no
        chunk is kept, all are, and the trace says so."""
        t0 = time.perf_counter()
        st = StageTrace("filter")
        cfg = self.config
        cot_prompt = self._fit(COT_PROMPT, [c.chunk.text for c in chunks], cfg.cot_max_tokens, st.notes, "filter CoT",
                               question=question)  # fmt: skip
        cot_r = await self._ask(cot_prompt, cfg.cot_max_tokens)
        st.add(cot_r)
        cot = cot_r.text.strip()
        schema = JUDGEMENT_SCHEMA
        prompts = [
            self._fit(JUDGE_PROMPT, [c.chunk.text], cfg.judge_max_tokens, st.notes, f"filter judgement {c.chunk.chunk_id}",
                      question=question, cot=cot)  # fmt: skip
            for c in chunks
        ]
        replies = await asyncio.gather(*(self._ask(p, cfg.judge_max_tokens, schema) for p in prompts))
        judgements = []
        for c, r in zip(chunks, replies):
            st.add(r)
            judgements.append(Judgement(c.chunk.chunk_id, parse_judgement(r.text), r.text))
        st.notes.append(
            "judgements constrained to JSON by the backend"
            if self.llm.supports_json_schema and self.llm.is_chat_model
            else "judgements not constrained (backend has no JSON schema support): parsed leniently"
        )
        unparsed = [j.chunk_id for j in judgements if j.keep is None]
        if unparsed:
            st.notes.append(f"{len(unparsed)} judgement(s) unparseable, chunks kept: {unparsed}")
        kept = [c for c, j in zip(chunks, judgements) if j.keep is not False]
        if not kept:
            kept = list(chunks)
            st.notes.append(f"filter kept no chunk: keeping all {len(chunks)}")
        st.wall_ms = _ms(t0)
        return kept, cot, judgements, st

    async def generate(
        self, question: str, details: Sequence[str], global_information: str | None = None
    ) -> tuple[str, int, StageTrace]:
        """Section 4.4: answer from global information (if any) + detail texts; returns the answer,
        the generator's input tokens and the trace."""
        t0 = time.perf_counter()
        st = StageTrace("generator")
        texts = list(details)
        if global_information:
            texts = [GLOBAL_HEADER + global_information, DETAILS_HEADER + (texts[0] if texts else "")] + texts[1:]
        max_t = self.config.generator_max_tokens
        prompt = self._fit(GENERATOR_PROMPT, texts, max_t, st.notes, "generator", question=question)
        r = await self._ask(prompt, max_t)
        st.add(r)
        st.wall_ms = _ms(t0)
        # finished as the LongReader's direct answer: cleaned, cut to its span, yes/no for a yes/no question
        answer, _ = finish_short_answer(r.text, question, "", "\n".join(texts))
        return answer, r.prompt_tokens, st

    # -- strategies -------------------------------------------------------------------------------

    async def run(
        self,
        question: str,
        retrieval: ChunkRetrieval,
        paragraphs: Mapping[str, SourceParagraph],
        strategy: str | None = None,
    ) -> DualResult:
        """Run ``strategy`` (default ``config.strategy``) over retrieved chunks."""
        strategy = check_strategy(strategy or self.config.strategy)
        return (await self.run_many(question, retrieval, paragraphs, [strategy]))[strategy]

    async def run_many(
        self,
        question: str,
        retrieval: ChunkRetrieval,
        paragraphs: Mapping[str, SourceParagraph],
        strategies: Sequence[str],
    ) -> dict[str, DualResult]:
        """Run several strategies over the same retrieved chunks, each stage at most once: by the
        definitions of Section 5.3, E&F's global information is Ext's and its kept chunks are Fil's,
        so the extractor and the filter run once for all strategies that need them (together, since
        the two perspectives are independent) and only the generator runs per strategy. A shared
        stage appears in every result that used it, with the same trace."""
        t0 = time.perf_counter()
        strategies = [check_strategy(s) for s in dict.fromkeys(strategies)]
        if not strategies:
            raise InvalidRequest(f"no strategy given; valid: {', '.join(STRATEGIES)}")
        if not isinstance(question, str) or not question.strip():
            raise InvalidRequest("question must be a non-empty str")
        chunks = list(retrieval.chunks)
        if not chunks:
            raise ValueError("no retrieved chunks to answer from")
        need_e = any(s in USES_EXTRACTOR for s in strategies)
        need_f = any(s in USES_FILTER for s in strategies)
        extractor, filter_, generator = self.stages
        jobs = []
        if need_e:
            jobs.append(extractor.extract(question, chunks, paragraphs))
        if need_f:
            jobs.append(filter_.filter(question, chunks))
        done = list(await asyncio.gather(*jobs))
        info = cot = None
        paragraph_ids: list[str] = []
        judgements: list[Judgement] = []
        kept_f = chunks
        st_e = st_f = None
        if need_e:
            info, paragraph_ids, st_e = done.pop(0)
        if need_f:
            kept_f, cot, judgements, st_f = done.pop(0)
        shared_ms = _ms(t0)

        out: dict[str, DualResult] = {}
        for strategy in strategies:
            t1 = time.perf_counter()
            notes = list(retrieval.trace.notes)
            stages: list[StageTrace] = []
            uses_e, uses_f = strategy in USES_EXTRACTOR, strategy in USES_FILTER
            if uses_e:
                stages.append(st_e)
            if uses_f:
                stages.append(st_f)
            kept = kept_f if uses_f else chunks
            if strategy == "R&L":
                mapped = map_to_paragraphs(chunks, paragraphs)
                pids = [p.id for p, _ in mapped]
                details = [_titled(p) for p, _ in mapped]
                notes.append(f"R&L: {len(chunks)} chunks -> {len(mapped)} source paragraphs as long context")
            else:
                pids = paragraph_ids if uses_e else []
                details = [c.chunk.text for c in kept]
            if len(strategies) > 1 and (uses_e or uses_f):
                notes.append("extractor/filter stages shared with the other strategies of this question")
            answer, gen_in, st_g = await generator.generate(question, details, info if uses_e else None)
            stages.append(st_g)
            out[strategy] = DualResult(
                question=question,
                strategy=strategy,
                answer=answer,
                retrieved=chunks,
                kept_chunk_ids=[c.chunk.chunk_id for c in kept],
                paragraph_ids=pids,
                global_information=info if uses_e else None,
                cot=cot if uses_f else None,
                judgements=judgements if uses_f else [],
                generator_input_tokens=gen_in,
                retrieval=retrieval.trace.to_dict(),
                stages=stages,
                notes=notes,
                total_ms=round(shared_ms + _ms(t1), 2) if (uses_e or uses_f) else _ms(t1),
            )
        return out

    async def answer(self, question: str, index: ChunkIndex, strategy: str | None = None) -> DualResult:
        """Retrieve from ``index`` and run ``strategy``."""
        strategy = check_strategy(strategy or self.config.strategy)
        retrieval = index.retriever.retrieve(question)
        return await self.run(question, retrieval, index.paragraphs, strategy)


def _titled(p: SourceParagraph) -> str:
    return f"{p.title}\n{p.text}" if p.title else p.text


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000.0, 2)
