"""What the routes share: the handles of the deployments behind the ingress, the config, the
metrics, and the steps every route takes (validate, encode + retrieve, read, the dual strategies).

One :class:`Gateway` per ingress replica (:class:`serve.app.Ingress` builds it); the routers in
:mod:`serve.routes` reach it through :func:`gateway` (``request.app.state.gateway``). No Serve
import: a test builds one over fake handles and drives the routes in process.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from longrag.admission import Admission
from longrag.config import LongRAGConfig
from longrag.index.graph import split_mode
from longrag.reading.reader import ReaderResult
from longrag.retrieval.hops import iterate
from longrag.types import InvalidRequest, Retrieval
from serve import stages
from serve.errors import ApiError
from serve.schemas import AnswerResponse, Evidence, RetrieveRequest

# trace key of /v1/answer -> field of the reader's result
_READ_TRACE = {
    "prompt_tokens": "prompt_tokens",
    "completion_tokens": "completion_tokens",
    "context_truncated": "truncated",
    "context_compressed": "compressed",
    "context_tokens": "context_tokens",
    "cached_prompt_tokens": "cached_prompt_tokens",
    "answer_fallback": "answer_fallback",
    "reader_model": "model",
    "answer_mode": "answer_mode",
    "time_to_answer_ms": "time_to_answer_ms",
    "long_answer_cached_tokens": "long_answer_cached_tokens",
    "unit_cache": "unit_cache",
    "context_packed": "packed",
    "paragraphs_read": "paragraphs_read",
    "paragraphs_cut": "paragraphs_cut",
}


def ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1e3, 2)


class NoMetrics:
    """Metrics off (tests of the routes outside Ray)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@dataclass
class Gateway:
    """The deployments behind the ingress (Serve handles, or anything with ``.method.remote()``)."""

    config: LongRAGConfig
    encoder: Any = None
    retriever: Any = None
    reader: Any = None
    llm: Any = None
    longcontext: Any = None
    dual: Any = None  # serve.dual.DualReader: strategy requests and the model longrag-dual; None: not deployed
    metrics: Any = field(default_factory=NoMetrics)
    app_name: str | None = None  # the Serve application, for /readyz
    #: the reader's requests admitted at once in this replica (serve.max_reader_requests; serve.middleware.Admitted)
    admission: Admission | None = None

    def __post_init__(self) -> None:
        if self.admission is None:
            s = self.config.serve
            self.admission = Admission(s.max_reader_requests, max_wait_s=s.max_reader_wait_s)

    def validate(self, req: RetrieveRequest) -> tuple[str, int]:
        s = self.config.serve
        question = req.question.strip()
        if len(question) > s.max_question_chars:
            raise ApiError(422, f"question is {len(question)} characters; the limit is {s.max_question_chars} "
                           "(serve.max_question_chars)", [f"question: longer than {s.max_question_chars} characters"])
        k = s.default_k if req.k is None else req.k
        if not 1 <= k <= s.max_k:
            raise ApiError(422, f"k must be between 1 and {s.max_k}, got {k}", [f"k: must be 1..{s.max_k}"])
        return question, k

    async def retrieve(self, question: str, k: int, mode: str | None = None) -> tuple[Retrieval, dict[str, Any]]:
        """Encode + retrieve; ``mode`` (None: ``retrieval.mode``) iterative runs the hop loop
        (:func:`longrag.retrieval.hops.iterate`) over the same two stages and the LLM."""
        mode = mode or self.config.retrieval.mode
        if mode == "iterative":
            return await self._iterate(question, k)
        hybrid, graph = split_mode(mode)
        return await self._search(question, k, hybrid=hybrid, graph=graph)

    async def _iterate(self, question: str, k: int) -> tuple[Retrieval, dict[str, Any]]:
        r, t = self.config.retrieval, self.config.serve.timeouts
        founds: list[Retrieval] = []
        traces: list[dict[str, Any]] = []

        async def search(query: str, n: int) -> list[Any]:
            found, trace = await self._search(query, n)
            founds.append(found)
            traces.append(trace)
            return found.units

        t0 = time.perf_counter()
        res = await iterate(question, k, search, _StageLLM(self.llm, t.read_s), max_hops=r.max_hops,
                            evidence_units=r.evidence_units, bridge_max_tokens=r.bridge_max_tokens)
        worst = min(founds, key=lambda f: (f.coverage.answered, not f.coverage.degraded))
        trace = {**traces[0], "encode_ms": round(sum(tr["encode_ms"] for tr in traces), 2),
                 "retrieve_ms": round(sum(tr["retrieve_ms"] for tr in traces), 2),
                 "bridge_ms": round(sum(h.llm_ms for h in res.hops), 2), "iterate_ms": ms(t0),
                 "hops": [h.to_dict() for h in res.hops]}
        return Retrieval(units=res.units, coverage=worst.coverage, trace=worst.trace), trace

    async def _search(self, question: str, k: int, hybrid: bool = False,
                      graph: bool = False) -> tuple[Retrieval, dict[str, Any]]:
        trace: dict[str, Any] = {}
        t0 = time.perf_counter()
        t = self.config.serve.timeouts
        try:
            vector = await stages.run_stage("encode", t.encode_s, lambda: self.encoder.encode.remote(question),
                                            trace=trace)
        except InvalidRequest as exc:  # serve.deployments.BadQuestion: the encoder refused the question
            raise ApiError(422, stages.one_line(exc), [f"question: {stages.one_line(exc)}"]) from None
        trace["encode_ms"] = ms(t0)
        t1 = time.perf_counter()
        args: tuple[Any, ...] = (vector, k, question) if hybrid else (vector, k)  # the question's text: the BM25 half
        if graph:
            args = (vector, k, question if hybrid else None, True)
        try:
            found: Retrieval = await stages.run_stage("retrieve", t.retrieve_s,
                                                      lambda: self.retriever.retrieve.remote(*args), trace=trace)
        except InvalidRequest as exc:  # LexicalIndexMissing / GraphMissing: a build written without BM25 / its graph
            raise ApiError(422, stages.one_line(exc), [f"mode: {stages.one_line(exc)}"]) from None
        trace["retrieve_ms"] = ms(t1)
        trace.update({f"retrieve.{key}": v for key, v in found.trace.items()})
        self.metrics.retrieval(found.coverage)
        return found, trace

    async def evidence(self, req: RetrieveRequest) -> tuple[str, int, Retrieval, list[Any], dict[str, Any]]:
        """Validate, retrieve, and the units a reader can read (503 when there are none)."""
        question, k = self.validate(req)
        found, trace = await self.retrieve(question, k, req.mode)
        units = found.readable()
        if not units:
            raise ApiError(503, "no evidence could be retrieved", {"coverage": found.coverage.to_dict()})
        return question, k, found, units, trace

    def done(self, trace: dict[str, Any], t0: float, read: ReaderResult | None = None) -> None:
        trace["total_ms"] = ms(t0)
        self.metrics.stages(trace)
        if read is not None:
            self.metrics.llm_tokens(read.prompt_tokens, read.completion_tokens)

    async def read(self, question: str, units: list[Any], compression: str | None, trace: dict[str, Any],
                   long_answer: bool | None = None) -> ReaderResult:
        return await stages.run_stage("read", self.config.serve.timeouts.read_s,
                                      lambda: self.reader.read.remote(question, units, compression, long_answer),
                                      trace=trace)

    async def read_stream(self, question: str, units: list[Any], compression: str | None,
                          long_answer: bool | None = None):
        """The Reader's stream: the ShortAnswer as soon as it is ready, the long answer's deltas
        (str), then the ReaderResult; retried once when it fails before its first item
        (:func:`serve.stages.stream_stage`)."""
        async for item in stages.stream_stage(
                "read", self.config.serve.timeouts.read_s,
                lambda: self.reader.options(stream=True).read_stream.remote(question, units, compression,
                                                                            long_answer)):
            yield item

    def answer_response(self, question: str, found: Retrieval, read: ReaderResult, trace: dict[str, Any],
                        t0: float, t1: float) -> AnswerResponse:
        trace["read_ms"] = ms(t1)
        trace.update({f"read.{key}": v for key, v in read.stages_ms.items()})
        trace.update({name: getattr(read, key) for name, key in _READ_TRACE.items()})
        used = set(read.units_used)
        evidence = [Evidence(unit_id=u.unit_id, titles=u.titles, score=u.score, used=u.unit_id in used)
                    for u in found.units]
        self.done(trace, t0, read)
        return AnswerResponse(question=question, answer=read.answer, long_answer=read.long_answer,
                              evidence=evidence, coverage=found.coverage, trace=trace)

    def require_dual(self) -> Any:
        if self.dual is None:
            raise ApiError(503, "this app has no dual-perspective deployments (serve.dual); drop 'strategy'")
        return self.dual

    async def answer_dual(self, strategy: str | None, question: str, found: Retrieval, units: list[Any],
                          trace: dict[str, Any], t0: float) -> AnswerResponse:
        """A strategy (None: the DualReader's ``dual.strategy``) over the retrieved units' paragraphs
        (serve.dual): ``/v1/answer`` and ``longrag-dual``."""
        dual = self.require_dual()
        t1 = time.perf_counter()
        try:
            res = (await stages.run_stage("dual", self.config.serve.timeouts.dual_s,
                                          lambda: dual.units.remote(question, units, strategy),
                                          trace=trace)).to_dict()
        except InvalidRequest as exc:
            raise ApiError(422, stages.one_line(exc), [stages.one_line(exc)]) from None
        trace["dual_ms"] = ms(t1)
        trace["dual"] = res["trace"] | {k: res[k] for k in ("kept_chunk_ids", "global_information", "cot",
                                                             "judgements", "chunks")}  # fmt: skip
        kept = set(res["kept_chunk_ids"])
        used = {c["paragraph_id"].rsplit("/", 1)[0] for c in res["chunks"] if c["position"] in kept}
        evidence = [Evidence(unit_id=u.unit_id, titles=u.titles, score=u.score, used=u.unit_id in used)
                    for u in found.units]
        self.done(trace, t0)
        return AnswerResponse(question=question, answer=res["answer"], long_answer="", evidence=evidence,
                              coverage=found.coverage, trace=trace, strategy=res["strategy"])


class _StageLLM:
    """The LLMServer handle as the hop loop's LLM: one ``chat`` through the ``bridge`` stage
    (its deadline, one retry on a failure)."""

    def __init__(self, handle: Any, timeout_s: float) -> None:
        self.handle, self.timeout_s = handle, timeout_s

    async def chat(self, messages: list[dict[str, str]], *, max_tokens: int, temperature: float | None = None) -> Any:
        return await stages.run_stage("bridge", self.timeout_s,
                                      lambda: self.handle.chat.remote(messages, max_tokens, temperature))


class InProcess:
    """An object in this process called as a deployment handle is: ``h.method.remote(*args)`` is an
    awaitable of ``target.method(*args)`` (the colocated stages, ``serve.colocate``; fakes
    in tests). ``options()`` is accepted and changes nothing."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def options(self, **_: Any) -> InProcess:
        return self

    def __getattr__(self, name: str) -> Any:
        return _Method(getattr(self.target, name))


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        res = self.fn(*args, **kwargs)
        if inspect.isawaitable(res) or inspect.isasyncgen(res):
            return res
        return _ready(res)


async def _ready(value: Any) -> Any:
    return value


async def gateway(request: Request) -> Gateway:
    """FastAPI dependency: the replica's gateway (``async``: FastAPI runs a plain function
    dependency in its thread pool, a thread hand-off per request)."""
    return request.app.state.gateway
