"""Reader benchmark: the reader against a bare prompt, and which context suits a CPU (full units vs
MixPR-compressed, by budget).

The plan, all in process and Ray-free, so it measures the reader and not the cluster:

1. the paragraphs of the evaluated questions are pooled into one corpus (each question's own
   distractors plus everyone else's), linked by title mentions and grouped into long units
   (LongRAG, Jiang et al. 2024, Algorithm 1), chunked, embedded with the bundled encoder and searched
   with exact MaxP: the top ``k`` units of every question are the reader's candidates;
2. every :class:`ReaderSetting` reads them: ``plain`` is the bare-prompt baseline (one message over
   the top units that fit the budget, first line kept); ``full`` keeps whole top units while they
   fit the budget (the reader's ``truncate`` mode), ``mixpr`` squeezes all candidates into the same
   budget with question-seeded Mixture-of-PageRanks (Alonso & Millidge, 2024) sentence selection;
   either with the reader's ``direct`` short answer or the paper's ``two_turn`` one (``/2t``);
3. EM / F1 (SQuAD rules), seconds per question, prompt tokens and short-answer fallbacks per
   setting, and where the points go (:func:`attribution`): the raw reply, each cleaning step, and
   for two turns the long answer's own span.

Two settings whose fitted contexts are equal for a question (the candidates fit the budget whole,
so MixPR has nothing to remove) share one read. Settings that differ only in few-shot examples run
back to back, so their first turn comes from the KV cache: compare their turn-2 seconds, not totals.
Results are appended to a checkpoint as they come, so a rerun resumes. The tables, the attribution
and the plot are :mod:`lab.reader_report`'s.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from longrag.config import EmbeddingConfig, ReaderConfig, UnitConfig
from longrag.eval.corpus import pool_examples
from longrag.eval.datasets import QAExample
from longrag.eval.links import build_links
from longrag.eval.metrics import exact_match, f1
from longrag.journal import JsonlJournal
from longrag.llm.base import LLM
from longrag.mixpr.config import MixPRConfig
from longrag.types import Unit

log = logging.getLogger(__name__)

Mode = Literal["full", "mixpr", "plain"]
Answer = Literal["direct", "two_turn"]
MAX_CANDIDATES = 64

#: The bare-prompt baseline: one system + one user message over the candidate text, nothing else. It
#: opens as the reader's prompts do (system message, "Documents:"), so the reads of one question share
#: the documents' KV cache; what follows the documents is the bare request.
PLAIN_USER = "Documents:\n\n{context}\n\nQuestion: {question}\nReply with only the answer."
PLAIN_MAX_TOKENS = 32


def plain_answer(reply: str) -> str:
    """The bare prompt's answer: the reply's first line as it is (stripped), nothing else."""
    lines = [ln.strip() for ln in reply.strip().splitlines()]
    return lines[0] if lines else ""


def plain_messages(question: str, context: str) -> list[dict[str, str]]:
    """The bare prompt over ``context``: the reader's system message and :data:`PLAIN_USER`."""
    from longrag.reading.prompts import READER_SYSTEM

    return [{"role": "system", "content": READER_SYSTEM},
            {"role": "user", "content": PLAIN_USER.format(context=context, question=question)}]


@dataclass(frozen=True)
class ReaderSetting:
    """One reader configuration under test. ``plain`` is the baseline every reader table carries:
    the same candidate text as ``full`` at the same budget (whole top units, the next one trimmed),
    one system + user message asking for the answer alone, greedy, ``PLAIN_MAX_TOKENS``, the
    reply's first line kept as it is. ``full``/``mixpr`` are the LongReader with that context fit
    and ``answer`` (``direct`` or the paper's ``two_turn``)."""

    mode: Mode
    budget: int  # reader.max_context_tokens
    few_shot: int = 0
    answer: Answer = "direct"

    @property
    def label(self) -> str:
        head = f"{self.mode}@{self.budget / 1024:g}K"
        return f"{head} 2turn fs{self.few_shot}" if self.answer == "two_turn" else head

    def reader_config(self, base: ReaderConfig) -> ReaderConfig:
        return base.model_copy(update={
            "max_context_tokens": self.budget,
            "few_shot_examples": self.few_shot,
            "compression": "mixpr" if self.mode == "mixpr" else "truncate",
            "answer": self.answer,
        })


def parse_settings(spec: str) -> list[ReaderSetting]:
    """``"plain@1024,mixpr@1024,mixpr@1024/2t,full@2048/2t/fs8"`` -> settings (``/2t``: the two-turn
    short answer; ``/fsN``: N few-shot examples in its second turn, default 0)."""
    out: list[ReaderSetting] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        head, *opts = item.split("/")
        mode, sep, budget = head.partition("@")
        if mode not in ("full", "mixpr", "plain") or not sep or not budget.isdigit() or int(budget) < 1:
            raise ValueError(f"setting {item!r} is not MODE@TOKENS[/2t][/fsN] with MODE full, mixpr or plain")
        answer, few_shot = "direct", 0
        for opt in opts:
            if opt == "2t":
                answer = "two_turn"
            elif opt.startswith("fs") and opt[2:].isdigit():
                few_shot = int(opt[2:])
            else:
                raise ValueError(f"setting {item!r}: unknown option {opt!r} (/2t or /fsN)")
        if few_shot and answer != "two_turn":
            raise ValueError(f"setting {item!r}: few-shot examples belong to the two-turn answer (/2t/fsN)")
        if mode == "plain" and answer != "direct":
            raise ValueError(f"setting {item!r}: the plain baseline has one message (no /2t)")
        out.append(ReaderSetting(mode, int(budget), few_shot, answer))  # type: ignore[arg-type]
    if not out:
        raise ValueError("no reader settings given")
    return out


class PlainReader:
    """The bare-prompt baseline (see :class:`ReaderSetting`): the LongReader's truncating fit for the
    candidate text, then one call. Kept here, apart from the product's reader, so that it stays the
    simplest honest baseline whatever the reader becomes."""

    def __init__(self, llm: LLM, config: ReaderConfig) -> None:
        from longrag.reading.reader import LongReader

        self.llm = llm
        self.config = config
        self._fitter = LongReader(llm, config.model_copy(update={"compression": "truncate"}))

    def fit(self, question: str, units: list[Unit], compression: str | None = None):
        return self._fitter.fit(question, units, "truncate")

    async def read(self, question: str, units: list[Unit]) -> Any:
        from longrag.reading.prompts import format_context
        from longrag.reading.reader import ReaderResult

        t0 = time.perf_counter()
        fitted = self.fit(question, units)
        out = await self.llm.chat(plain_messages(question, format_context(fitted.blocks)), max_tokens=PLAIN_MAX_TOKENS)
        ms = (time.perf_counter() - t0) * 1e3
        return ReaderResult(answer=plain_answer(out.text), long_answer="", units_used=fitted.unit_ids,
                            prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
                            stages_ms={"fit_context": 0.0, "long_answer": 0.0, "short_answer": ms, "total": ms},
                            truncated=fitted.truncated, context_tokens=fitted.tokens, raw_short_answer=out.text)


@dataclass
class Candidates:
    """The top units of every question and how they were made."""

    units: dict[str, list[Unit]]  # qid -> units, best first
    stats: dict[str, Any] = field(default_factory=dict)


def retrieve_candidates(
    examples: Sequence[QAExample],
    k: int,
    *,
    min_tokens: int = 0,
    embedding: EmbeddingConfig | None = None,
    units: UnitConfig | None = None,
    links: str = "title_mentions",
    progress: Callable[[str], None] = log.info,
) -> Candidates:
    """Pool the examples' paragraphs, group them into long units, and find each question's top
    units with exact MaxP over the bundled encoder (one process, no Ray): at least ``k``, and more
    (up to ``MAX_CANDIDATES``) until they hold ``min_tokens`` tokens, so that every budget under test
    has more candidates than it can take whole."""
    from longrag.index.chunking import chunk_units
    from longrag.index.embedding import Embedder
    from longrag.index.maxp import MaxPIndex
    from longrag.index.units import make_units_from_config
    from longrag.text.tokens import counter_for_model_dir

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    t0 = time.perf_counter()
    pooled = pool_examples(list(examples))
    docs = build_links(pooled.documents, links)
    embedder = Embedder(embedding or EmbeddingConfig())
    counter = counter_for_model_dir(embedder.tokenizer_path)
    unit_list = make_units_from_config(docs, units or UnitConfig(kind="grouped"), counter)
    chunks = chunk_units(unit_list, embedder.max_chunk_tokens, counter)
    progress(f"{len(docs)} documents -> {len(unit_list)} units -> {len(chunks)} chunks; embedding")
    t1 = time.perf_counter()
    vectors = embedder.encode_passages([c.text for c in chunks])
    index = MaxPIndex.build(vectors, [c.chunk_id for c in chunks], [c.unit_id for c in chunks])
    queries = embedder.encode_queries([ex.question for ex in examples])
    hits = index.search(queries, max(k, MAX_CANDIDATES) if min_tokens else k)
    by_id = {u.unit_id: u for u in unit_list}
    out: dict[str, list[Unit]] = {}
    for ex, row in zip(examples, hits):
        ranked = [by_id[h.unit_id] for h in row]
        n = k
        while n < len(ranked) and sum(u.n_tokens for u in ranked[:n]) < min_tokens:
            n += 1
        out[ex.qid] = ranked[:n]
    stats = {"documents": len(docs), "units": len(unit_list), "chunks": len(chunks), "k": k,
             "min_tokens": min_tokens,
             "mean_candidates": round(float(np.mean([len(v) for v in out.values()])), 1),
             "mean_candidate_tokens": round(float(np.mean([sum(u.n_tokens for u in v) for v in out.values()]))),
             "links": links, "embed_s": round(time.perf_counter() - t1, 1),
             "total_s": round(time.perf_counter() - t0, 1)}
    return Candidates(out, stats)


def _context_key(reader: Any, question: str, units: list[Unit], compression: str) -> str:
    fitted = reader.fit(question, units, compression)
    return hashlib.sha256("\x00".join(fitted.blocks).encode()).hexdigest()


async def run_settings(
    llm: LLM,
    examples: Sequence[QAExample],
    candidates: Candidates,
    settings: Sequence[ReaderSetting],
    *,
    base: ReaderConfig | None = None,
    mixpr: MixPRConfig | None = None,
    checkpoint: Path | None = None,
    progress: Callable[[str], None] = log.info,
) -> list[dict[str, Any]]:
    """Read every question under every setting; one row per (setting, question)."""
    from functools import partial

    from longrag.reading.longcontext import compress_units_with_mixpr
    from longrag.reading.reader import LongReader

    base = base or ReaderConfig()
    compressor = partial(compress_units_with_mixpr, cfg=mixpr or MixPRConfig())
    journal = JsonlJournal(checkpoint) if checkpoint is not None else None
    done: dict[tuple[str, str], dict[str, Any]] = {}
    for row in journal.records if journal is not None else []:
        if isinstance(row, dict) and "setting" in row and "qid" in row:
            done[(row["setting"], row["qid"])] = row
    readers = [(s, PlainReader(llm, s.reader_config(base)) if s.mode == "plain"
                else LongReader(llm, s.reader_config(base), compressor=compressor)) for s in settings]
    rows: list[dict[str, Any]] = []
    t_start, n_read = time.perf_counter(), 0
    # Question-major: the settings of one question run back to back, so those that give the model
    # the same context (other few-shot counts; MixPR with nothing to remove) reuse its KV cache or
    # share one read.
    for ex in examples:
        units = candidates.units[ex.qid]
        by_context: dict[tuple[str, int], dict[str, Any]] = {}
        for s, reader in readers:
            key = (s.label, ex.qid)
            if key in done:
                rows.append(done[key])
                continue
            ctx = _context_key(reader, ex.question, units, reader.config.compression)
            share_key = (ctx, s.mode == "plain", s.answer, s.few_shot)
            shared = by_context.get(share_key)
            if shared is None:
                res = await reader.read(ex.question, units)
                n_read += 1
                shared = {
                    "answer": res.answer, "long_answer": res.long_answer, "raw_short_answer": res.raw_short_answer,
                    "fallback": res.answer_fallback, "context_tokens": res.context_tokens,
                    "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
                    "seconds": round(res.stages_ms["total"] / 1e3, 3),
                    "long_s": round(res.stages_ms["long_answer"] / 1e3, 3),
                    "short_s": round(res.stages_ms["short_answer"] / 1e3, 3),
                    "truncated": res.truncated, "compressed": res.compressed,
                }
                by_context[share_key] = shared
            row = {"setting": s.label, "mode": s.mode, "budget": s.budget, "few_shot": s.few_shot, "answer_mode": s.answer,
                   "qid": ex.qid, "question": ex.question, "golds": list(ex.answers), **shared,
                   "em": exact_match(shared["answer"], ex.answers), "f1": f1(shared["answer"], ex.answers)}
            rows.append(row)
            if journal is not None:
                journal.append(row)
        progress(f"{len(rows)}/{len(settings) * len(examples)} rows, {n_read} reads, "
                 f"{time.perf_counter() - t_start:.0f}s")
    return rows


def setting_dicts(settings: Sequence[ReaderSetting]) -> list[dict[str, Any]]:
    return [asdict(s) | {"label": s.label} for s in settings]
