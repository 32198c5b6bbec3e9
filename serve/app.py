"""The LongRAG Serve application: HTTP ingress and the app builder.

    serve run serve/configs/cpu.yaml                       # the embedded default
    serve run serve.app:app_builder index=artifacts/sample  # same, without a config file

Endpoints: ``POST /v1/retrieve``, ``POST /v1/answer``, ``POST /v1/longcontext``, ``GET /healthz``;
OpenAPI at ``/docs``.
"""


import time
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from ray import serve
from ray.serve.handle import DeploymentHandle

from longrag.config import LongRAGConfig, load_config
from serve.deployments import LLMServer, QueryEncoder, Reader, Retriever
from serve.longcontext import LongContextReader, LongContextRequest, LongContextResponse
from serve.schemas import (
    AnswerRequest,
    AnswerResponse,
    Health,
    RetrieveRequest,
    RetrieveResponse,
)

api = FastAPI(
    title="LongRAG on Ray",
    version="0.1.0",
    description="Long retrieval units, MaxP retrieval over sharded FAISS indexes, a two-turn long reader.",
)


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with one readable message per problem (malformed JSON, missing or unknown fields)."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        problems.append(f"{where}: {err.get('msg')}")
    return JSONResponse(status_code=422, content={"error": "invalid request", "detail": problems})


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1e3, 2)


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=128)
@serve.ingress(api)
class Ingress:
    def __init__(self, encoder: DeploymentHandle, retriever: DeploymentHandle, reader: DeploymentHandle,
                 llm: DeploymentHandle, config: dict[str, Any], longcontext: DeploymentHandle) -> None:
        self.encoder, self.retriever, self.reader, self.llm = encoder, retriever, reader, llm
        self.longcontext = longcontext
        self.config = LongRAGConfig.model_validate(config)

    def _validate(self, req: RetrieveRequest) -> tuple[str, int]:
        s = self.config.serve
        question = req.question.strip()
        if not question:
            raise HTTPException(status_code=422, detail="question must not be empty")
        if len(question) > s.max_question_chars:
            raise HTTPException(
                status_code=422,
                detail=f"question is {len(question)} characters; the limit is {s.max_question_chars}",
            )
        k = s.default_k if req.k is None else req.k
        if not 1 <= k <= s.max_k:
            raise HTTPException(status_code=422, detail=f"k must be between 1 and {s.max_k}, got {k}")
        return question, k

    async def _retrieve(self, question: str, k: int) -> tuple[dict[str, Any], dict[str, Any]]:
        trace: dict[str, Any] = {}
        t0 = time.perf_counter()
        vector = await self.encoder.encode.remote(question)
        trace["encode_ms"] = _ms(t0)
        t1 = time.perf_counter()
        found = await self.retriever.retrieve.remote(vector, k)
        trace["retrieve_ms"] = _ms(t1)
        trace.update({f"retrieve.{key}": v for key, v in found["trace"].items()})
        return found, trace

    @api.get("/healthz", response_model=Health)
    async def healthz(self) -> Health:
        info = await self.retriever.describe.remote()
        llm = await self.llm.describe.remote()
        return Health(status="ok", llm=llm["name"], **info)

    @api.post("/v1/retrieve", response_model=RetrieveResponse)
    async def retrieve(self, req: RetrieveRequest) -> RetrieveResponse:
        t0 = time.perf_counter()
        question, k = self._validate(req)
        found, trace = await self._retrieve(question, k)
        units = []
        for hit in found["hits"]:
            unit = found["units"].get(hit["unit_id"], {})
            units.append({
                "unit_id": hit["unit_id"],
                "titles": unit.get("titles", []),
                "doc_ids": unit.get("doc_ids", []),
                "score": hit["score"],
                "shard": hit["shard"],
                "best_chunk_id": hit["best_chunk_id"],
                "best_chunk": unit.get("best_chunk_text"),
                "n_tokens": unit.get("n_tokens", 0),
            })
        trace["total_ms"] = _ms(t0)
        return RetrieveResponse(question=question, k=k, units=units, coverage=found["coverage"], trace=trace)

    @api.post("/v1/answer", response_model=AnswerResponse)
    async def answer(self, req: AnswerRequest) -> AnswerResponse:
        t0 = time.perf_counter()
        question, k = self._validate(req)
        found, trace = await self._retrieve(question, k)
        ordered = [found["units"][h["unit_id"]] for h in found["hits"] if h["unit_id"] in found["units"]]
        if not ordered:
            raise HTTPException(status_code=503, detail={"error": "no evidence could be retrieved",
                                                         "coverage": found["coverage"]})
        t1 = time.perf_counter()
        read = await self.reader.read.remote(question, ordered, req.compression)
        trace["read_ms"] = _ms(t1)
        trace.update({f"read.{key}": v for key, v in read["stages_ms"].items()})
        trace["prompt_tokens"] = read["prompt_tokens"]
        trace["completion_tokens"] = read["completion_tokens"]
        trace["context_truncated"] = read["truncated"]
        trace["context_compressed"] = read["compressed"]
        trace["context_tokens"] = read["context_tokens"]
        used = set(read["units_used"])
        evidence = [
            {"unit_id": h["unit_id"], "titles": found["units"].get(h["unit_id"], {}).get("titles", []),
             "score": h["score"], "used": h["unit_id"] in used}
            for h in found["hits"]
        ]
        trace["total_ms"] = _ms(t0)
        return AnswerResponse(question=question, answer=read["answer"], long_answer=read["long_answer"],
                              evidence=evidence, coverage=found["coverage"], trace=trace)


    @api.post("/v1/longcontext", response_model=LongContextResponse)
    async def longcontext_answer(self, req: LongContextRequest) -> LongContextResponse:
        """One long document + question: MixPR (or sparse/hybrid) selection, then the reader."""
        limit, n = self.config.mixpr.max_document_bytes, len(req.document.encode("utf-8"))
        if n > limit:
            raise HTTPException(status_code=413,
                                detail=f"document is {n} bytes; the limit is {limit} (mixpr.max_document_bytes)")
        try:
            result = await self.longcontext.run.remote(req.model_dump())
        except ValueError as exc:  # Ray re-raises the pipeline's ValueError (bad k, route, ...) as one
            raise HTTPException(status_code=422, detail=str(exc).strip().splitlines()[-1]) from None
        return LongContextResponse.model_validate(result)


class AppArgs(BaseModel):
    """Arguments of ``app_builder`` (the ``args:`` block of a serve config YAML)."""

    index: str = Field(..., description="Build directory or s3:// URI written by jobs.index")
    config: str | None = Field(None, description="LongRAGConfig YAML; default: the build's own config")
    overrides: list[str] = Field(default_factory=list, description="section.field=value overrides")


def app_builder(args: AppArgs | dict[str, Any]) -> serve.Application:
    args = AppArgs.model_validate(args) if isinstance(args, dict) else args
    if args.config:
        cfg = load_config(args.config, args.overrides)
    else:
        from longrag.store import ArtifactStore

        # The build's own config: the query encoder must be the model the chunks were embedded with.
        cfg = LongRAGConfig.model_validate(ArtifactStore.open(args.index).read_manifest().config)
        cfg = cfg.with_overrides(args.overrides)
    llm = LLMServer.bind(cfg.llm.model_dump())
    return Ingress.bind(
        QueryEncoder.bind(cfg.embedding.model_dump()),
        Retriever.bind(args.index, cfg.index.model_dump()),
        Reader.bind(llm, cfg.llm.model_dump(), cfg.reader.model_dump(), cfg.mixpr.model_dump()),
        llm,
        cfg.model_dump(),
        LongContextReader.bind(llm, cfg.llm.model_dump(), cfg.mixpr.model_dump(), cfg.embedding.model_dump()),
    )
