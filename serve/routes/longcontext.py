"""``POST /v1/longcontext``: one long document and a question; MixPR (or sparse/hybrid) selection and
the reader, or a dual-perspective strategy over the document's paragraphs."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from longrag.types import InvalidRequest
from serve import stages
from serve.errors import ERRORS, ApiError
from serve.gateway import Gateway, gateway
from serve.longcontext import LongContextRequest, LongContextResponse
from serve.schemas import ErrorResponse

router = APIRouter()


@router.post("/v1/longcontext", response_model=LongContextResponse,
             responses={**ERRORS, 413: {"model": ErrorResponse, "description": "Document over mixpr.max_document_bytes."}})
async def longcontext_answer(req: LongContextRequest, gw: Gateway = Depends(gateway)) -> LongContextResponse:
    """One long document + question: MixPR (or sparse/hybrid) selection, then the reader."""
    limit, n = gw.config.mixpr.max_document_bytes, len(req.document.encode("utf-8"))
    if n > limit:
        raise ApiError(413, f"document is {n} bytes; the limit is {limit} (mixpr.max_document_bytes)")
    q_limit = gw.config.serve.max_question_chars
    if req.question is not None and len(req.question.strip()) > q_limit:
        raise ApiError(422, f"question is {len(req.question.strip())} characters; the limit is {q_limit} "
                       "(serve.max_question_chars)", [f"question: longer than {q_limit} characters"])
    t = gw.config.serve.timeouts
    try:
        if req.strategy is None:
            return await stages.run_stage("longcontext", t.longcontext_s, lambda: gw.longcontext.run.remote(req))
        dual = gw.require_dual()
        res = (await stages.run_stage("dual", t.dual_s, lambda: dual.document.remote(
            req.document, req.question.strip(), req.strategy, req.k, req.retrieve_only))).to_dict()  # fmt: skip
    except InvalidRequest as exc:  # Ray re-raises the pipeline's InvalidRequest (bad k, route, ...) as one
        raise ApiError(422, stages.one_line(exc), [stages.one_line(exc)]) from None
    trace = res["trace"] | {k: res[k] for k in ("kept_chunk_ids", "global_information", "cot", "judgements")
                            if k in res}  # fmt: skip
    return LongContextResponse(answer=res.get("answer"), route=None, strategy=req.strategy,
                               chunks=res["chunks"], trace=trace)
