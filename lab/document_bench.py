"""The long-document reader (``jobs.longcontext``) against a bare prompt over the same document.

Each question of a bundled QA sample becomes one document: its gold paragraphs and ``distractors`` of
its own distractor paragraphs (seeded), in a seeded order, each as ``title`` + newline + text, blank
lines between them. Every :class:`DocumentSetting` answers the question over that document:

* ``plain``: the bare-prompt baseline of the reader benchmark (:data:`lab.reader_bench.PLAIN_USER`:
  one system + user message, "Reply with only the answer.", greedy, first line kept) over the whole
  document, trimmed to the same context budget as the pipeline's when it is longer;
* ``<retriever>/<route>[/kN]``: :class:`longrag.reading.longcontext.LongContextPipeline`, exactly as
  ``python -m jobs.longcontext --retriever R --route ROUTE --k N`` runs it (``mixpr/auto`` is the job's
  default: the LLM routes, MixPR ranks, the chunks that fit the window are read).

Every LLM call is evaluated cold (:attr:`~longrag.llm.base.LLM.cold_reads`): when two settings send
the same prompt, or the pipeline's reader prompt follows its router prompt, llama.cpp would otherwise
evaluate it from its cache, whose logits can differ in the last bits and so, now and then, the greedy
answer (1.5B, MuSiQue: the reader's prompt equal to the bare prompt's, read after the router's, gave
another answer on 6 of 50 questions, F1 40.7 against 42.1). Rows share the reader benchmark's shape, so :func:`lab.reader_report.summarize`,
``versus_plain``, ``attribution`` and ``markdown_table`` report them; they are appended to a journal as
they come, so a rerun resumes.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrag.eval.datasets import QAExample
from longrag.eval.metrics import exact_match, f1
from longrag.journal import JsonlJournal
from longrag.llm.base import LLM
from longrag.mixpr.config import MixPRConfig

log = logging.getLogger(__name__)

__all__ = ["DocumentSetting", "parse_document_settings", "question_document", "run_document_settings"]


@dataclass(frozen=True)
class DocumentSetting:
    """``plain`` (retriever None) or the long-context pipeline with ``retriever``/``route``/``k``
    (k None: ``mixpr.top_k``)."""

    retriever: str | None = None
    route: str = "auto"
    k: int | None = None

    @property
    def label(self) -> str:
        if self.retriever is None:
            return "plain"
        return f"{self.retriever}/{self.route}" + (f"/k{self.k}" if self.k is not None else "")

    @property
    def mode(self) -> str:
        return "plain" if self.retriever is None else "longcontext"


def parse_document_settings(spec: str) -> list[DocumentSetting]:
    """``"plain,mixpr/auto,sparse/local/k400"`` -> settings."""
    out: list[DocumentSetting] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item == "plain":
            out.append(DocumentSetting())
            continue
        parts = item.split("/")
        retriever, route = parts[0], parts[1] if len(parts) > 1 else "auto"
        k = None
        if len(parts) > 2:
            if len(parts) > 3 or not parts[2].startswith("k") or not parts[2][1:].isdigit() or int(parts[2][1:]) < 1:
                raise ValueError(f"setting {item!r} is not RETRIEVER/ROUTE[/kN]")
            k = int(parts[2][1:])
        if retriever not in ("mixpr", "sparse") or route not in ("auto", "local", "global"):
            raise ValueError(f"setting {item!r}: retriever mixpr or sparse, route auto, local or global (or 'plain')")
        out.append(DocumentSetting(retriever, route, k))
    if not out:
        raise ValueError("no settings given")
    return out


def question_document(ex: QAExample, distractors: int, seed: int = 0) -> str:
    """The question's gold paragraphs and ``distractors`` of its other paragraphs (chosen and ordered
    by a generator seeded with ``seed`` and the question id), as one document."""
    gold = [p for p in ex.paragraphs if p.is_supporting]
    if not gold:
        raise ValueError(f"question {ex.qid} has no supporting paragraph to build a document from")
    rng = random.Random(f"{seed}:{ex.qid}")
    others = [p for p in ex.paragraphs if not p.is_supporting]
    chosen = gold + rng.sample(others, min(distractors, len(others)))
    rng.shuffle(chosen)
    return "\n\n".join(f"{p.title}\n{p.text.strip()}" for p in chosen)


async def _read_plain(llm: LLM, question: str, document: str, budget: int) -> dict[str, Any]:
    from lab.reader_bench import PLAIN_MAX_TOKENS, plain_answer, plain_messages

    context = llm.truncate_tokens(document, budget)
    out = await llm.chat(plain_messages(question, context), max_tokens=PLAIN_MAX_TOKENS)
    return {"answer": plain_answer(out.text), "raw_short_answer": out.text, "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens, "context_tokens": llm.count_tokens(context),
            "truncated": context != document, "fallback": None}


async def _read_pipeline(pipe: Any, s: DocumentSetting, question: str, document: str) -> dict[str, Any]:
    res = await pipe.run(document, question, retriever=s.retriever, k=s.k, route=s.route)
    t = res.trace
    return {"answer": res.answer or "", "raw_short_answer": t.get("raw_answer", ""),
            "prompt_tokens": t.get("prompt_tokens", 0), "completion_tokens": t.get("completion_tokens", 0),
            "context_tokens": t.get("context_tokens", 0), "truncated": t.get("chunks_dropped", 0) > 0,
            "fallback": None, "route": res.route}


async def run_document_settings(
    llm: LLM,
    examples: Sequence[QAExample],
    settings: Sequence[DocumentSetting],
    *,
    mixpr: MixPRConfig | None = None,
    distractors: int = 2,
    seed: int = 0,
    checkpoint: Path | None = None,
    progress: Callable[[str], None] = log.info,
) -> list[dict[str, Any]]:
    """Answer every question under every setting; one row per (setting, question). The plain
    baseline's budget is the pipeline's context budget for that question (what the window leaves
    for passages), so neither reads more document than the other could."""
    from longrag.reading.longcontext import LongContextPipeline

    pipe = LongContextPipeline(mixpr or MixPRConfig(), llm=llm)
    journal = JsonlJournal(checkpoint) if checkpoint is not None else None
    done = {(r["setting"], r["qid"]): r for r in (journal.records if journal is not None else [])
            if isinstance(r, dict) and "setting" in r and "qid" in r}
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for ex in examples:
        document = question_document(ex, distractors, seed)
        # one question text for every setting: the pipeline's prompt strips it, so the bare prompt's does too
        # (6 of the first 50 HotpotQA questions start or end with a space; 1.5B: one of them got another answer)
        question = ex.question.strip()
        budget = pipe.context_budget(question, True, pipe.config)
        for s in settings:
            if (s.label, ex.qid) in done:
                rows.append(done[(s.label, ex.qid)])
                continue
            t0 = time.perf_counter()
            cold, llm.cold_reads = llm.cold_reads, True  # no call depends on the one before it
            try:
                if s.retriever is None:
                    got = await _read_plain(llm, question, document, budget)
                else:
                    got = await _read_pipeline(pipe, s, question, document)
            finally:
                llm.cold_reads = cold
            seconds = round(time.perf_counter() - t0, 3)
            row = {"setting": s.label, "mode": s.mode, "budget": budget, "few_shot": 0, "answer_mode": "direct",
                   "qid": ex.qid, "question": question, "golds": list(ex.answers), "document_chars": len(document),
                   **got, "long_answer": "", "seconds": seconds, "long_s": 0.0, "short_s": seconds,
                   "em": exact_match(got["answer"], ex.answers), "f1": f1(got["answer"], ex.answers)}
            rows.append(row)
            if journal is not None:
                journal.append(row)
        progress(f"{len(rows)}/{len(settings) * len(examples)} rows, {time.perf_counter() - t_start:.0f}s")
    return rows
