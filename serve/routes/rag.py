"""``POST /v1/retrieve`` (the long retriever) and ``POST /v1/answer`` (retriever + long reader, or a
dual-perspective strategy; ``"stream": true``: server-sent events)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from longrag.reading.reader import ShortAnswer
from longrag.types import Retrieval
from serve import openai_compat as oai
from serve import stages
from serve.errors import ERRORS, ApiError
from serve.gateway import Gateway, gateway
from serve.schemas import AnswerRequest, AnswerResponse, RetrieveRequest, RetrieveResponse

router = APIRouter()


@router.post("/v1/retrieve", response_model=RetrieveResponse, responses=ERRORS)
async def retrieve(req: RetrieveRequest, gw: Gateway = Depends(gateway)) -> RetrieveResponse:
    t0 = time.perf_counter()
    question, k = gw.validate(req)
    found, trace = await gw.retrieve(question, k, req.mode)
    gw.done(trace, t0)
    return RetrieveResponse(question=question, k=k, units=found.units, coverage=found.coverage, trace=trace)


@router.post("/v1/answer", response_model=AnswerResponse, responses={**ERRORS, 200: {
    "description": "The answer; with \"stream\": true a text/event-stream of events: retrieval (the "
    "units found and the coverage), answer (the short answer as soon as it is ready, {\"answer\", "
    "\"answer_fallback\", \"time_to_answer_ms\"}), token (the long answer as the reader writes it, {\"text\"}), then "
    "trace (the whole AnswerResponse), or error ({\"error\"}).",
    "content": {"text/event-stream": {}}}})
async def answer(req: AnswerRequest, gw: Gateway = Depends(gateway)) -> Any:
    t0 = time.perf_counter()
    if req.strategy is not None and req.stream:
        raise ApiError(422, "stream is not available with a strategy", ["stream: not with strategy"])
    question, k, found, units, trace = await gw.evidence(req)
    if req.strategy is not None:
        return await gw.answer_dual(req.strategy, question, found, units, trace, t0)
    if req.stream:
        return StreamingResponse(_events(gw, question, k, found, units, req.compression, req.long_answer, trace, t0),
                                 media_type="text/event-stream")
    t1 = time.perf_counter()
    read = await gw.read(question, units, req.compression, trace, req.long_answer)
    return gw.answer_response(question, found, read, trace, t0, t1)


async def _events(gw: Gateway, question: str, k: int, found: Retrieval, units: list[Any],
                  compression: str | None, long_answer: bool | None, trace: dict[str, Any], t0: float):
    yield oai.sse("retrieval", {"question": question, "k": k,
                                "units": [u.model_dump(mode="json") for u in found.units],
                                "coverage": found.coverage.to_dict(), "trace": dict(trace)})
    t1 = time.perf_counter()
    try:
        async for item in gw.read_stream(question, units, compression, long_answer):
            if isinstance(item, str):
                yield oai.sse("token", {"text": item})
            elif isinstance(item, ShortAnswer):
                yield oai.sse("answer", {"answer": item.answer, "answer_fallback": item.answer_fallback,
                                         "time_to_answer_ms": round(item.time_to_answer_ms, 1)})
            else:
                response = gw.answer_response(question, found, item, trace, t0, t1)
                yield oai.sse("trace", response.model_dump(mode="json"))
    except Exception as exc:  # the status line is sent: the error goes in the stream, in the one shape
        yield oai.sse("error", stages.error_event(exc))
