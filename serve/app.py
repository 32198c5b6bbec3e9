"""The LongRAG Serve application: HTTP ingress and the app builder.

    python -m serve.run serve/configs/cpu.yaml             # the embedded default (make serve)
    serve run serve/configs/cpu.yaml                       # the same with Ray's CLI
    serve run serve.app:app_builder index=artifacts/sample  # without a config file

Endpoints: ``POST /v1/retrieve``, ``POST /v1/answer``, ``POST /v1/longcontext``, ``GET /healthz``;
OpenAPI at ``/docs`` (with the limits of the running config). Every error response has one JSON
shape, ``{"error": {"code", "message", "detail"}}`` (:class:`serve.schemas.ErrorResponse`).
"""


import asyncio
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from longrag.config import LongRAGConfig, load_config
from serve.deployments import BadQuestion, LLMServer, QueryEncoder, Reader, Retriever
from serve.longcontext import LongContextReader, LongContextRequest, LongContextResponse, longcontext_embedding
from serve.dual import bind_dual
from serve.run import missing_resources
from serve.schemas import (
    AnswerRequest,
    AnswerResponse,
    DeploymentHealth,
    ErrorResponse,
    Health,
    RetrieveRequest,
    RetrieveResponse,
    ShardRedundancy,
    served_limits,
    set_served_limits,
    state_limits,
)

api = FastAPI(
    title="LongRAG on Ray",
    version="0.1.0",
    description="Long retrieval units, MaxP retrieval over sharded FAISS indexes, a two-turn long reader. "
    'Every error response is {"error": {"code", "message", "detail"}}.',
)

# ---------------------------------------------------------------------------- errors: one shape
CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 408: "timeout",
         413: "payload_too_large", 422: "invalid_request", 429: "too_many_requests",
         500: "internal_error", 503: "unavailable"}


class ApiError(Exception):
    """An error the API answers with; rendered as :class:`serve.schemas.ErrorResponse`."""

    def __init__(self, status: int, message: str, detail: Any = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail
        self.code = code or CODES.get(status, f"http_{status}")


def error_response(status: int, message: str, detail: Any = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"code": code or CODES.get(status, f"http_{status}"), "message": message, "detail": detail}}
    return JSONResponse(status_code=status, content=body, headers=headers)


def _cause(exc: BaseException) -> BaseException:
    """The user exception inside a Ray task error (a deployment call that raised)."""
    return getattr(exc, "cause", None) or exc


def _one_line(exc: BaseException) -> str:
    text = str(_cause(exc)).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


@api.exception_handler(ApiError)
async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.detail, exc.code)


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with one readable message per problem (malformed JSON, missing, unknown or mistyped fields)."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        problems.append(f"{where}: {msg}")
    return error_response(422, "invalid request: " + "; ".join(problems), problems)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing errors (404, 405) and any HTTPException, in the same shape."""
    message = exc.detail if isinstance(exc.detail, str) else CODES.get(exc.status_code, "error")
    detail = None if isinstance(exc.detail, str) else exc.detail
    return error_response(exc.status_code, message, detail, headers=getattr(exc, "headers", None))


@api.middleware("http")
async def _unhandled_errors(request: Request, call_next):
    """Anything else that escapes an endpoint: a JSON 500 naming the error, not a plain-text page."""
    try:
        return await call_next(request)
    except Exception as exc:  # the last line of defence: every error keeps the one JSON shape
        return error_response(500, f"internal error: {type(_cause(exc)).__name__}: {_one_line(exc)}")


ERRORS = {
    422: {"model": ErrorResponse, "description": "Invalid request: one message per problem in error.detail."},
    500: {"model": ErrorResponse, "description": "Internal error."},
    503: {"model": ErrorResponse, "description": "No shard or no replica could serve the request."},
}

_SCHEMA: dict[str, Any] = {}


def _openapi() -> dict[str, Any]:
    """The OpenAPI schema with the limits of the running app's config (see ``state_limits``)."""
    limits = served_limits()
    key = str(sorted(limits.items()))
    if _SCHEMA.get("key") != key:
        schema = get_openapi(title=api.title, version=api.version, description=api.description, routes=api.routes)
        if limits:
            state_limits(schema, **limits)
        _SCHEMA.update(key=key, schema=schema)
    return _SCHEMA["schema"]


api.openapi = _openapi  # type: ignore[method-assign]


# trace key of /v1/answer -> field of the reader's result
_READ_TRACE = {
    "prompt_tokens": "prompt_tokens",
    "completion_tokens": "completion_tokens",
    "context_truncated": "truncated",
    "context_compressed": "compressed",
    "context_tokens": "context_tokens",
    "cached_prompt_tokens": "cached_prompt_tokens",
    "answer_fallback": "answer_fallback",
}


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1e3, 2)


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=128)
@serve.ingress(api)
class Ingress:
    def __init__(self, encoder: DeploymentHandle, retriever: DeploymentHandle, reader: DeploymentHandle,
                 llm: DeploymentHandle, config: dict[str, Any], longcontext: DeploymentHandle,
                 dual: DeploymentHandle | None = None) -> None:
        self.encoder, self.retriever, self.reader, self.llm = encoder, retriever, reader, llm
        self.longcontext = longcontext
        self.dual = dual  # serve.dual.DualReader: the "strategy" requests
        self.config = LongRAGConfig.model_validate(config)
        s = self.config.serve
        set_served_limits(max_question_chars=s.max_question_chars, max_k=s.max_k,
                          max_document_bytes=self.config.mixpr.max_document_bytes)
        try:
            self.app_name = serve.get_replica_context().app_name
        except Exception:  # outside a Serve replica (not used so)
            self.app_name = None

    def _validate(self, req: RetrieveRequest) -> tuple[str, int]:
        s = self.config.serve
        question = req.question.strip()
        if len(question) > s.max_question_chars:
            raise ApiError(422, f"question is {len(question)} characters; the limit is {s.max_question_chars} "
                           "(serve.max_question_chars)", [f"question: longer than {s.max_question_chars} characters"])
        k = s.default_k if req.k is None else req.k
        if not 1 <= k <= s.max_k:
            raise ApiError(422, f"k must be between 1 and {s.max_k}, got {k}", [f"k: must be 1..{s.max_k}"])
        return question, k

    async def _retrieve(self, question: str, k: int) -> tuple[dict[str, Any], dict[str, Any]]:
        trace: dict[str, Any] = {}
        t0 = time.perf_counter()
        try:
            vector = await self.encoder.encode.remote(question)
        except BadQuestion as exc:
            raise ApiError(422, _one_line(exc), [f"question: {_one_line(exc)}"]) from None
        trace["encode_ms"] = _ms(t0)
        t1 = time.perf_counter()
        found = await self.retriever.retrieve.remote(vector, k)
        trace["retrieve_ms"] = _ms(t1)
        trace.update({f"retrieve.{key}": v for key, v in found["trace"].items()})
        return found, trace

    @api.get("/healthz", response_model=Health, responses={503: {"model": ErrorResponse, "description":
             "Unavailable: error.detail is the Health report (deployments not running, shards without a live replica)."}})
    async def healthz(self) -> Any:
        """The build served, live replicas per shard, and every deployment that is not HEALTHY with
        Serve's reason (e.g. the resources a replica waits for)."""
        problems: list[str] = []
        deployments: dict[str, DeploymentHealth] = {}
        running: dict[str, int] = {}
        try:
            status = await asyncio.to_thread(serve.status)
            app = status.applications.get(self.app_name) if self.app_name else None
        except Exception as exc:  # the controller is unreachable: say so, keep answering
            app = None
            problems.append(f"serve.status() failed: {_one_line(exc)}")
        for name, d in (app.deployments.items() if app else []):
            states = {_value(k): v for k, v in d.replica_states.items()}
            running[name] = states.get("RUNNING", 0)
            if _value(d.status) != "HEALTHY" or running[name] == 0:
                short = missing_resources(d.message or "")
                deployments[name] = DeploymentHealth(status=_value(d.status), running_replicas=running[name],
                                                     message=d.message or "", missing_resources=short)
                problems.append(f"{name}: {_value(d.status)}, {running[name]} running"
                                + (f", lacks {short}" if short else "") + (f": {d.message}" if d.message else ""))
        unavailable = any(n == 0 for n in running.values())

        async def ask(handle: DeploymentHandle, name: str) -> dict[str, Any] | None:
            if running.get(name, 1) == 0:
                return None
            try:
                return await asyncio.wait_for(handle.describe.remote(), 10)
            except Exception as exc:
                problems.append(f"{name}.describe failed: {type(_cause(exc)).__name__}: {_one_line(exc)}")
                return None

        info, llm = await asyncio.gather(ask(self.retriever, "Retriever"), ask(self.llm, "LLMServer"))
        index = [ShardRedundancy(**row) for row in (info or {}).get("index", [])]
        if info is None:
            unavailable = True
        for row in index:
            if row.live == 0:
                unavailable = True
                problems.append(f"shard {row.shard}: no live replica")
            elif row.live < row.replicas:
                problems.append(f"shard {row.shard}: {row.live} of {row.replicas} replicas live")
        s = self.config.serve
        health = Health(
            status="unavailable" if unavailable else ("degraded" if problems else "ok"),
            **{k: v for k, v in (info or {}).items() if k != "index"},
            llm=(llm or {}).get("name"),
            index=index,
            redundancy="; ".join(f"shard {r.shard}: {r.live} of {r.replicas} replicas" for r in index),
            deployments=deployments,
            problems=problems,
            limits={"max_question_chars": s.max_question_chars, "max_k": s.max_k, "default_k": s.default_k},
        )
        if unavailable:
            return error_response(503, "unavailable: " + ("; ".join(problems) or "no index information"),
                                   health.model_dump())
        return health

    @api.post("/v1/retrieve", response_model=RetrieveResponse, responses=ERRORS)
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

    @api.post("/v1/answer", response_model=AnswerResponse, responses=ERRORS)
    async def answer(self, req: AnswerRequest) -> AnswerResponse:
        t0 = time.perf_counter()
        question, k = self._validate(req)
        found, trace = await self._retrieve(question, k)
        ordered = [found["units"][h["unit_id"]] for h in found["hits"] if h["unit_id"] in found["units"]]
        if not ordered:
            raise ApiError(503, "no evidence could be retrieved", {"coverage": found["coverage"]})
        if req.strategy is not None:
            return await self._answer_dual(req.strategy, question, found, ordered, trace, t0)
        t1 = time.perf_counter()
        read = await self.reader.read.remote(question, ordered, req.compression)
        trace["read_ms"] = _ms(t1)
        trace.update({f"read.{key}": v for key, v in read["stages_ms"].items()})
        trace.update({name: read[key] for name, key in _READ_TRACE.items()})
        used = set(read["units_used"])
        evidence = [
            {"unit_id": h["unit_id"], "titles": found["units"].get(h["unit_id"], {}).get("titles", []),
             "score": h["score"], "used": h["unit_id"] in used}
            for h in found["hits"]
        ]
        trace["total_ms"] = _ms(t0)
        return AnswerResponse(question=question, answer=read["answer"], long_answer=read["long_answer"],
                              evidence=evidence, coverage=found["coverage"], trace=trace)

    async def _answer_dual(self, strategy: str, question: str, found: dict[str, Any], ordered: list[dict[str, Any]],
                           trace: dict[str, Any], t0: float) -> AnswerResponse:
        """``/v1/answer`` with a strategy: the retrieved units' paragraphs go through serve.dual."""
        if self.dual is None:
            raise ApiError(503, "this app has no dual-perspective deployments (serve.dual); drop 'strategy'")
        t1 = time.perf_counter()
        try:
            res = await self.dual.units.remote(question, ordered, strategy)
        except ValueError as exc:
            raise ApiError(422, _one_line(exc), [_one_line(exc)]) from None
        trace["dual_ms"] = _ms(t1)
        trace["dual"] = res["trace"] | {k: res[k] for k in ("kept_chunk_ids", "global_information", "cot",
                                                             "judgements", "chunks")}  # fmt: skip
        kept = set(res["kept_chunk_ids"])
        used = {c["paragraph_id"].rsplit("/", 1)[0] for c in res["chunks"] if c["position"] in kept}
        evidence = [
            {"unit_id": h["unit_id"], "titles": found["units"].get(h["unit_id"], {}).get("titles", []),
             "score": h["score"], "used": h["unit_id"] in used}
            for h in found["hits"]
        ]
        trace["total_ms"] = _ms(t0)
        return AnswerResponse(question=question, answer=res["answer"], long_answer="", evidence=evidence,
                              coverage=found["coverage"], trace=trace, strategy=strategy)

    @api.post("/v1/longcontext", response_model=LongContextResponse,
              responses={**ERRORS, 413: {"model": ErrorResponse, "description": "Document over mixpr.max_document_bytes."}})
    async def longcontext_answer(self, req: LongContextRequest) -> LongContextResponse:
        """One long document + question: MixPR (or sparse/hybrid) selection, then the reader."""
        limit, n = self.config.mixpr.max_document_bytes, len(req.document.encode("utf-8"))
        if n > limit:
            raise ApiError(413, f"document is {n} bytes; the limit is {limit} (mixpr.max_document_bytes)")
        q_limit = self.config.serve.max_question_chars
        if req.question is not None and len(req.question.strip()) > q_limit:
            raise ApiError(422, f"question is {len(req.question.strip())} characters; the limit is {q_limit} "
                           "(serve.max_question_chars)", [f"question: longer than {q_limit} characters"])
        if req.strategy is not None:
            if self.dual is None:
                raise ApiError(503, "this app has no dual-perspective deployments (serve.dual); drop 'strategy'")
            try:
                res = await self.dual.document.remote(req.document, req.question.strip(), req.strategy, req.k,
                                                      req.retrieve_only)  # fmt: skip
            except ValueError as exc:
                raise ApiError(422, _one_line(exc), [_one_line(exc)]) from None
            trace = res["trace"] | {k: res[k] for k in ("kept_chunk_ids", "global_information", "cot", "judgements")
                                    if k in res}  # fmt: skip
            return LongContextResponse(answer=res.get("answer"), route=None, strategy=req.strategy,
                                       chunks=res["chunks"], trace=trace)  # fmt: skip
        try:
            result = await self.longcontext.run.remote(req.model_dump(exclude={"strategy"}))
        except ValueError as exc:  # Ray re-raises the pipeline's ValueError (bad k, route, ...) as one
            raise ApiError(422, _one_line(exc), [_one_line(exc)]) from None
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
        LongContextReader.bind(llm, cfg.llm.model_dump(), cfg.mixpr.model_dump(),
                               longcontext_embedding(cfg.embedding).model_dump()),
        bind_dual(cfg, llm),
    )
