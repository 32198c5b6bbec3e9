"""Long-context question answering over ONE long document (Alonso and Millidge, 2024, "Mixture-of-PageRanks:
Replacing Long-Context with Real-Time, Sparse GraphRAG", Section 4): the request carries the document
and (optionally) a question.

    document -> chunk + TF-IDF -> retrieve top-k chunks (MixPR | RAG-Sparse | RAG-Hybrid)
             -> route (auto: the LLM router; local: PPR; global: plain PageRank)
             -> read the kept chunks, in document order, with the LLM -> answer

Without a question the query is the document's own last chunk(s) (the paper's convention: the
instruction is part of the text) and the reader is asked to follow it.

Fitting the window: the reader's prompt (instructions + question + chunks + the answer budget:
``mixpr.short_answer_max_tokens`` for a short answer, else ``mixpr.answer_max_tokens``; +
``mixpr.reader_reserve_tokens``) must fit ``llm.context_window``;
when the retrieved chunks do not, the lowest-scored ones are dropped first and the rest stay in
document order (``trace.chunks_dropped``).

:func:`compress_units_with_mixpr` is the same selection used as a context compressor for the
LongRAG reader: when retrieved long units exceed the window, question-seeded MixPR picks the
sentences to keep instead of cutting the units off.

Ray-free: the Serve deployment (``serve/longcontext.py``) and the CLI (``jobs/longcontext.py``)
own a :class:`LongContextPipeline`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from longrag.llm.base import LLM
from longrag.mixpr import MixPRConfig, MixPRResult, MixPRRetriever, SparseRetriever, prepare_document
from longrag.mixpr.baselines import DenseEncoder, HybridRetriever
from longrag.mixpr.retriever import PreparedDocument
from longrag.mixpr.router import route_query, router_text
from longrag.reading.answers import finish_short_answer
from longrag.reading.prompts import direct_messages
from longrag.types import InvalidRequest

__all__ = [
    "RetrieverName",
    "RouteChoice",
    "LongContextResult",
    "LongContextPipeline",
    "reader_messages",
    "select_within_budget",
    "compress_units_with_mixpr",
]

RetrieverName = Literal["mixpr", "sparse", "hybrid"]
RouteChoice = Literal["auto", "local", "global"]

READER_SYSTEM = (
    "You answer questions about one long document. You are shown passages taken from it, in the "
    "order in which they appear in the document; other parts of the document are left out. Use "
    "only these passages. Answer briefly and directly."
)
_USER_WITH_QUESTION = "PASSAGES:\n{context}\n\nQUESTION: {question}\nANSWER:"
_USER_WITHOUT_QUESTION = (
    "PASSAGES:\n{context}\n\nThe document ends with this request; carry it out using the passages.\n"
    "REQUEST: {question}\nANSWER:"
)
_CHUNK_SEP = "\n"


@dataclass
class LongContextResult:
    """``answer`` is None when only retrieval was asked for. ``route`` is "local"/"global" for
    MixPR and None for the baselines (they do not route). ``chunks``: ``{position, text, score}``
    in document order (all retrieved chunks; ``trace.chunks_read`` of them went to the reader)."""

    answer: str | None
    route: str | None
    chunks: list[dict[str, Any]]
    trace: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["answer"] is None:
            del d["answer"]
        return d


def reader_messages(question: str, chunk_texts: Sequence[str], *, has_question: bool = True,
                    short_answer: bool = False) -> list[dict]:
    """The reader's conversation: passages in the order given, then the question (or, without a
    question, the document's own closing request). ``short_answer`` asks for the answer alone in the
    long reader's direct prompt, the bare prompt's own words (:func:`longrag.reading.prompts.direct_messages`):
    the long-context reader then answers as the bare prompt would, and its finishing (span, yes/no) is
    what it adds."""
    context = _CHUNK_SEP.join(chunk_texts)
    if has_question and short_answer:
        return direct_messages(question.strip(), context)
    template = _USER_WITH_QUESTION if has_question else _USER_WITHOUT_QUESTION
    return [
        {"role": "system", "content": READER_SYSTEM},
        {"role": "user", "content": template.format(context=context, question=question.strip())},
    ]


def join_in_document_order(document: str, starts: Sequence[int], ends: Sequence[int]) -> str:
    """Chunks (their spans in ``document``, in document order) as the reader reads them: two chunks
    that follow each other in the document are joined by what separated them there, reduced to one
    space, one line break or a blank line (a paragraph break); a blank line where chunks were left out.
    With every chunk kept this is the document again, up to whitespace: the reader keeps the
    paragraphs (and their titles) that sentence chunks would otherwise run together."""
    out: list[str] = []
    prev_end: int | None = None
    for a, b in zip(starts, ends):
        if prev_end is not None:
            gap = document[prev_end:a]
            if a < prev_end or gap.strip():  # chunks left out between them
                out.append("\n\n")
            elif gap.count("\n") >= 2:
                out.append("\n\n")
            else:
                out.append("\n" if "\n" in gap else " ")
        out.append(document[a:b])
        prev_end = b
    return "".join(out)


def select_within_budget(scores: np.ndarray, costs: np.ndarray, budget: int, sep_cost: int = 0) -> np.ndarray:
    """Indices (ascending) of the items to keep: best score first (ties: earlier index), each kept
    when its cost (+ ``sep_cost`` after the first) still fits ``budget``; items that do not fit are
    skipped so smaller lower-scored ones may still get in."""
    scores = np.asarray(scores, dtype=np.float64)
    costs = np.asarray(costs)
    if scores.ndim != 1 or costs.shape != scores.shape:
        raise ValueError(f"scores and costs must be 1-D of one shape, got {scores.shape} and {costs.shape}")
    if not np.issubdtype(costs.dtype, np.integer) or (costs.size and costs.min() < 0):
        raise ValueError("costs must be non-negative integers")
    order = np.argsort(-scores, kind="stable")
    room = int(budget)
    kept: list[int] = []
    for i in order.tolist():
        c = int(costs[i]) + (sep_cost if kept else 0)
        if c <= room:
            kept.append(i)
            room -= c
            if room <= sep_cost:
                break
    return np.sort(np.asarray(kept, dtype=np.int64))


class LongContextPipeline:
    """Retrieve from one long document and read the result with an LLM.

    llm: the reader and router (any :class:`longrag.llm.base.LLM`); may be None for retrieval with
    an explicit route. encoder: the dense encoder for ``retriever="hybrid"`` (e.g.
    ``longrag.index.embedding.Embedder``)."""

    def __init__(self, config: MixPRConfig | None = None, llm: LLM | None = None, encoder: DenseEncoder | None = None):
        self.config = config or MixPRConfig()
        self.llm = llm
        self.encoder = encoder

    # -- retrieval ---------------------------------------------------------------------------
    def _prepare(self, document: str, question: str | None, cfg: MixPRConfig) -> PreparedDocument:
        return prepare_document(document, question, cfg)

    def _rank(self, prep: PreparedDocument, retriever: str, route: str | None, cfg: MixPRConfig) -> MixPRResult:
        if retriever == "mixpr":
            return MixPRRetriever(cfg).rank(prep, route)
        if retriever == "sparse":
            return SparseRetriever(cfg).rank(prep)
        return HybridRetriever(self.encoder, cfg).rank(prep)

    def _check(self, document: Any, question: Any, retriever: str, k: int | None, route: str, read: bool) -> None:
        if not isinstance(document, str):
            raise InvalidRequest(f"document must be str, got {type(document).__name__}")
        if not document.strip():
            raise InvalidRequest("document is empty (no non-whitespace text)")
        if question is not None and not isinstance(question, str):
            raise InvalidRequest(f"question must be str or None, got {type(question).__name__}")
        if retriever not in ("mixpr", "sparse", "hybrid"):
            raise InvalidRequest(f"retriever must be 'mixpr', 'sparse' or 'hybrid', got {retriever!r}")
        if route not in ("auto", "local", "global"):
            raise InvalidRequest(f"route must be 'auto', 'local' or 'global', got {route!r}")
        if k is not None and (not isinstance(k, int) or k < 1):
            raise InvalidRequest(f"k must be a positive int, got {k!r}")
        if retriever == "hybrid" and self.encoder is None:
            raise ValueError("retriever='hybrid' needs a dense encoder (LongContextPipeline(encoder=...))")
        needs_router = retriever == "mixpr" and route == "auto"
        if (read or needs_router) and self.llm is None:
            what = "the router (route='auto')" if needs_router else "reading (answer)"
            raise ValueError(f"{what} needs an LLM; pass llm=..., or retrieve only with route 'local'/'global'")

    async def run(
        self,
        document: str,
        question: str | None = None,
        *,
        retriever: RetrieverName = "mixpr",
        k: int | None = None,
        route: RouteChoice = "auto",
        read: bool = True,
    ) -> LongContextResult:
        """The whole pipeline; ``read=False`` stops after retrieval (``answer`` None). CPU-heavy
        steps run in a worker thread so an event loop (Serve) stays responsive."""
        self._check(document, question, retriever, k, route, read)
        t_start = time.perf_counter()
        if question is not None and not question.strip():
            question = None
        cfg = self.config if k is None else self.config.model_copy(update={"top_k": k})
        prep = await asyncio.to_thread(self._prepare, document, question, cfg)
        trace: dict[str, Any] = {"retriever": retriever, "k": cfg.top_k, "document_chars": len(document)}
        chosen: str | None = None
        if retriever == "mixpr":
            if route == "auto":
                t0 = time.perf_counter()
                text = question if question else router_text(prep.chunks.texts[: prep.n_doc], cfg.router_context_chunks)
                chosen = await route_query(
                    self.llm, text, fallback=cfg.router_fallback, max_tokens=cfg.router_max_tokens
                )
                trace["route_ms"] = _ms(time.perf_counter() - t0)
                trace["routed_by"] = "llm"
            else:
                chosen, trace["routed_by"] = route, "request"
        elif route != "auto":
            trace["route_ignored"] = route  # the baselines rank by similarity only
        res = await asyncio.to_thread(self._rank, prep, retriever, chosen, cfg)
        for key, v in res.timings.items():
            if key != "total":
                trace[f"{key}_ms"] = _ms(v)
        trace.update(
            n_chunks=res.n_chunks, n_distinct=res.n_distinct, n_edges=res.n_edges, iterations=res.iterations,
            alpha=None if np.isnan(res.alpha) else res.alpha, n_retrieved=len(res.chunks),
        )  # fmt: skip
        if res.query_edges is not None:
            trace["query_edges"] = res.query_edges
        if res.notes:
            trace["notes"] = list(res.notes)
        chunks = [{"position": c.position, "text": c.text, "score": c.score} for c in res.chunks]
        answer: str | None = None
        if read:
            t0 = time.perf_counter()
            answer, read_trace = await self._read(prep.query_text, question is not None, res, cfg, document)
            trace["read_ms"] = _ms(time.perf_counter() - t0)
            trace.update(read_trace)
        trace["total_ms"] = _ms(time.perf_counter() - t_start)
        return LongContextResult(answer=answer, route=chosen, chunks=chunks, trace=trace)

    # -- reading -----------------------------------------------------------------------------
    def context_budget(self, question: str, has_question: bool, cfg: MixPRConfig) -> int:
        """Tokens left for the passages: the window minus the prompt without passages, the answer
        budget and the reserve."""
        llm = self.llm
        empty = llm.count_message_tokens(reader_messages(question, [], has_question=has_question,
                                                         short_answer=cfg.short_answer))
        return llm.context_window - empty - answer_budget(has_question, cfg) - cfg.reader_reserve_tokens

    async def _read(
        self, question: str, has_question: bool, res: MixPRResult, cfg: MixPRConfig, document: str
    ) -> tuple[str, dict[str, Any]]:
        llm = self.llm
        budget = self.context_budget(question, has_question, cfg)
        texts = [c.text for c in res.chunks]
        if texts and budget > 0:
            costs = np.array([llm.count_tokens(t) for t in texts], dtype=np.int64)
            keep = select_within_budget(
                np.array([c.score for c in res.chunks]), costs, budget, llm.count_tokens(_CHUNK_SEP)
            )
        else:
            costs, keep = np.zeros(len(texts), np.int64), np.zeros(0, np.int64)
        kept = [res.chunks[i] for i in keep.tolist()]
        context = join_in_document_order(document, [c.start for c in kept], [c.end for c in kept])
        short = has_question and cfg.short_answer
        messages = reader_messages(question, [context] if kept else [], has_question=has_question, short_answer=short)
        out = await llm.chat(messages, max_tokens=answer_budget(has_question, cfg))
        answer = out.text.strip()
        if short:
            answer, _ = finish_short_answer(out.text, question, "", context, cut_span=False)
        trace = {
            "raw_answer": out.text,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "context_budget_tokens": int(budget),
            "context_tokens": int(costs[keep].sum()) if keep.size else 0,
            "chunks_read": len(kept),
            "chunks_dropped": len(texts) - len(kept),
        }
        return answer, trace


def answer_budget(has_question: bool, cfg: MixPRConfig) -> int:
    """Tokens the reader may generate: ``short_answer_max_tokens`` (capped by ``answer_max_tokens``)
    for a short answer to a question, ``answer_max_tokens`` for everything else."""
    if has_question and cfg.short_answer:
        return min(cfg.answer_max_tokens, cfg.short_answer_max_tokens)
    return cfg.answer_max_tokens


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def compress_units_with_mixpr(
    question: str,
    unit_texts: Sequence[str],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    cfg: MixPRConfig | None = None,
) -> str:
    """The retrieved long units squeezed into ``budget_tokens`` by MixPR instead of truncation.

    The units (rank order) are joined with blank lines into one document; when it fits the budget
    it is returned as is. Otherwise MixPR scores every sentence chunk with the question as the
    query (local route; the PPR restart is also seeded with the chunks most similar to the question:
    ``cfg.question_seeds``, 8 when the config has 0) and the best chunks are kept, greedily by
    score, while their tokens (``count_tokens``) fit. The kept chunks come back in document order,
    one per line, units separated by a blank line."""
    cfg = cfg or MixPRConfig()
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question must be a non-empty str")
    if isinstance(unit_texts, str):
        raise ValueError("unit_texts must be a sequence of str, got a single str")
    unit_texts = list(unit_texts)
    bad = [type(u).__name__ for u in unit_texts if not isinstance(u, str)]
    if bad:
        raise ValueError(f"unit_texts must contain only str, got {bad[0]}")
    units = [u for u in unit_texts if u.strip()]
    if budget_tokens < 1:
        raise ValueError(f"budget_tokens must be >= 1, got {budget_tokens}")
    unit_sep = "\n\n"
    document = unit_sep.join(units)
    if not units or count_tokens(document) <= budget_tokens:
        return document
    seeded = cfg.model_copy(update={"question_seeds": cfg.question_seeds or 8, "append_question": True})
    prep = prepare_document(document, question, seeded)
    seeded = seeded.model_copy(update={"top_k": max(prep.n_doc, 1)})
    res = MixPRRetriever(seeded).rank(prep, "local")
    if not res.chunks:
        return ""
    scores = np.array([c.score for c in res.chunks])
    costs = np.array([count_tokens(c.text) for c in res.chunks], dtype=np.int64)
    # a separator costs at most a blank line's tokens
    keep = select_within_budget(scores, costs, budget_tokens, count_tokens(unit_sep))
    # unit of each kept chunk, from the character offsets of the units in the joined document
    unit_starts = np.cumsum([0] + [len(u) + len(unit_sep) for u in units[:-1]])
    out: list[str] = []
    prev_unit = -1
    for i in keep.tolist():
        c = res.chunks[i]
        u = int(np.searchsorted(unit_starts, c.start, side="right") - 1)
        if out:
            out.append(unit_sep if u != prev_unit else "\n")
        out.append(c.text)
        prev_unit = u
    return "".join(out)
