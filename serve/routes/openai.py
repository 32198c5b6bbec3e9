"""The OpenAI-compatible API: ``GET /v1/models`` and ``POST /v1/chat/completions`` over the index
(models and messages: :mod:`serve.openai_compat`)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from longrag.reading.reader import ShortAnswer
from longrag.types import InvalidRequest, Retrieval
from serve import openai_compat as oai
from serve import stages
from serve.errors import ERRORS, ApiError
from serve.gateway import Gateway, gateway
from serve.schemas import AnswerResponse, ErrorResponse, RetrieveRequest

router = APIRouter()


def _extra(response: AnswerResponse) -> oai.LongRAGExtra:
    return oai.LongRAGExtra(long_answer=response.long_answer, evidence=response.evidence,
                            coverage=response.coverage, trace=response.trace)


@router.get("/v1/models", response_model=oai.ModelList, responses={401: ERRORS[401], 429: ERRORS[429]})
async def models(gw: Gateway = Depends(gateway)) -> oai.ModelList:
    """The models of ``/v1/chat/completions`` (``available: false``: not deployed here)."""
    return oai.model_list(dual_available=gw.dual is not None)


@router.post("/v1/chat/completions", response_model=oai.ChatCompletionResponse, responses={
    **ERRORS, 404: {"model": ErrorResponse, "description": "Unknown model, or one not available here."},
    200: {"description": "The completion; with \"stream\": true server-sent chat.completion.chunk "
          "events ending with data: [DONE].", "content": {"text/event-stream": {}}}})
async def chat_completions(req: oai.ChatCompletionRequest, gw: Gateway = Depends(gateway)) -> Any:
    """OpenAI-compatible chat over the index (see :mod:`serve.openai_compat`)."""
    t0 = time.perf_counter()
    try:
        pipeline = oai.route_model(req.model, dual_available=gw.dual is not None)
        question = req.question()
    except oai.ModelNotAvailable as exc:
        raise ApiError(404, str(exc), code="model_not_found") from None
    except InvalidRequest as exc:
        raise ApiError(422, f"invalid request: {exc}", [f"messages: {exc}"]) from None
    if req.strategy is not None and pipeline != "longrag-dual":
        raise ApiError(422, "strategy applies to model 'longrag-dual' only", ["strategy: only for longrag-dual"])
    question, k, found, units, trace = await gw.evidence(RetrieveRequest(question=question, k=req.k, mode=req.mode))
    if pipeline == "longrag-dual":
        return await _dual_chat(gw, req, question, found, units, trace, t0)
    cid, created = oai.completion_id(), oai.now()
    if req.stream:
        return StreamingResponse(_chat_events(gw, cid, created, req.model, question, found, units,
                                              req.compression, trace, t0), media_type="text/event-stream")
    t1 = time.perf_counter()
    read = await gw.read(question, units, req.compression, trace)
    response = gw.answer_response(question, found, read, trace, t0, t1)
    return oai.ChatCompletionResponse(
        id=cid, created=created, model=req.model,
        choices=[oai.ChatChoice(message=oai.ChatCompletionMessage(content=response.answer))],
        usage=oai.Usage(prompt_tokens=read.prompt_tokens, completion_tokens=read.completion_tokens,
                        total_tokens=read.prompt_tokens + read.completion_tokens),
        longrag=_extra(response),
    )


async def _chat_events(gw: Gateway, cid: str, created: int, model: str, question: str, found: Retrieval,
                       units: list[Any], compression: str | None, trace: dict[str, Any], t0: float):
    yield oai.chunk(cid, model, created, {"role": "assistant", "content": ""})
    t1 = time.perf_counter()
    try:
        async for item in gw.read_stream(question, units, compression):
            if isinstance(item, str):  # the long answer, after the short one (direct reader)
                yield oai.chunk(cid, model, created, {"reasoning_content": item})
                continue
            if isinstance(item, ShortAnswer):  # sent as soon as it is ready
                yield oai.chunk(cid, model, created, {"content": item.answer})
                continue
            response = gw.answer_response(question, found, item, trace, t0, t1)
            usage = {"prompt_tokens": item.prompt_tokens, "completion_tokens": item.completion_tokens,
                     "total_tokens": item.prompt_tokens + item.completion_tokens}
            yield oai.chunk(cid, model, created, {}, "stop", usage=usage,
                            longrag=_extra(response).model_dump(mode="json"))
    except Exception as exc:  # the status line is sent: the error goes in the stream, in the one shape
        yield oai.data(stages.error_event(exc))
    yield oai.DONE


async def _dual_chat(gw: Gateway, req: oai.ChatCompletionRequest, question: str, found: Retrieval,
                     units: list[Any], trace: dict[str, Any], t0: float) -> Any:
    """Model ``longrag-dual``: the dual-perspective pipeline with ``req.strategy`` (default
    ``dual.strategy``) over the retrieved units. Reached only when the app was built with one (see
    :func:`serve.openai_compat.route_model`). The answer comes whole (also when streamed)."""
    response = await gw.answer_dual(req.strategy, question, found, units, trace, t0)
    dual_stages = response.trace["dual"]["stages"]
    p_tok = sum(st["prompt_tokens"] for st in dual_stages)
    c_tok = sum(st["completion_tokens"] for st in dual_stages)
    usage = oai.Usage(prompt_tokens=p_tok, completion_tokens=c_tok, total_tokens=p_tok + c_tok)
    cid, created = oai.completion_id(), oai.now()
    if req.stream:
        async def events():
            yield oai.chunk(cid, req.model, created, {"role": "assistant", "content": ""})
            yield oai.chunk(cid, req.model, created, {"content": response.answer})
            yield oai.chunk(cid, req.model, created, {}, "stop", usage=usage.model_dump(),
                            longrag=_extra(response).model_dump(mode="json"))
            yield oai.DONE

        return StreamingResponse(events(), media_type="text/event-stream")
    return oai.ChatCompletionResponse(
        id=cid, created=created, model=req.model,
        choices=[oai.ChatChoice(message=oai.ChatCompletionMessage(content=response.answer))],
        usage=usage, longrag=_extra(response),
    )
