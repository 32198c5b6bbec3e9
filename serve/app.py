"""The LongRAG Serve application: HTTP ingress and the app builder.

    python -m serve.run serve/configs/cpu.yaml             # the embedded default (make serve)
    serve run serve/configs/cpu.yaml                       # the same with Ray's CLI
    serve run serve.app:app_builder index=artifacts/sample  # without a config file

Endpoints: ``POST /v1/retrieve``, ``POST /v1/answer`` (``"stream": true``: server-sent events),
``POST /v1/longcontext``, the OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models``
(:mod:`serve.openai_compat`), ``GET /healthz``, the web playground at ``GET /`` (:mod:`serve.playground`);
OpenAPI at ``/docs`` (with the limits of the running config). API keys, rate limit, body size and
CORS: :mod:`serve.guard`; metrics: :mod:`serve.metrics`.
Every error response has one JSON shape, ``{"error": {"code", "message", "detail"}}``
(:class:`serve.schemas.ErrorResponse`).
"""


import asyncio
import logging
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.middleware.cors import CORSMiddleware
from pydantic import BaseModel, Field
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from longrag.config import LongRAGConfig, load_config
from longrag.reading.reader import ReaderResult
from longrag.types import InvalidRequest, Retrieval, describe_redundancy
from serve import guard as guards
from serve import metrics as app_metrics
from serve import openai_compat as oai
from serve import playground
from serve import stages
from serve.deployments import BadQuestion, LLMServer, QueryEncoder, Reader, Retriever
from serve.longcontext import LongContextReader, LongContextRequest, LongContextResponse, longcontext_embedding
from serve.dual import bind_dual
from serve.run import missing_resources, serve_status
from serve.schemas import (
    AnswerRequest,
    AnswerResponse,
    DeploymentHealth,
    ErrorResponse,
    Evidence,
    Health,
    RetrieveRequest,
    RetrieveResponse,
    served_limits,
    set_served_limits,
    state_limits,
)

log = logging.getLogger("ray.serve")  # Serve's replica logger: lines carry the request id

api = FastAPI(
    title="LongRAG on Ray",
    version="0.1.0",
    description="Long retrieval units, MaxP retrieval over sharded FAISS indexes, a two-turn long reader. "
    'Every error response is {"error": {"code", "message", "detail"}}.',
)

# ---------------------------------------------------------------------------- errors: one shape
CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 408: "timeout",
         413: "payload_too_large", 422: "invalid_request", 429: "too_many_requests",
         500: "internal_error", 503: "unavailable", 504: "timeout"}


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


@api.exception_handler(ApiError)
async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.detail, exc.code)


@api.exception_handler(stages.StageError)
async def _stage_error(request: Request, exc: stages.StageError) -> JSONResponse:
    """A stage past its deadline (504) or failed twice (503), named (:mod:`serve.stages`)."""
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


def request_id(request: Request) -> str:
    """The id Serve's proxy gave the request (also in its ``X-Request-ID`` response header and in
    the replica's log lines), or the client's ``X-Request-ID``, or a new one."""
    try:
        from ray.serve.context import _get_serve_request_context

        rid = _get_serve_request_context().request_id
    except Exception:  # noqa: BLE001 - outside a replica (tests of the bare FastAPI app)
        rid = ""
    return rid or request.headers.get("x-request-id") or uuid.uuid4().hex


@api.middleware("http")
async def _unhandled_errors(request: Request, call_next):
    """Anything else that escapes an endpoint: logged with its traceback and the request id (the
    replica's log, ``ray.serve`` logger); the client gets a JSON 500 with that id and no internals."""
    try:
        return await call_next(request)
    except Exception:  # the last line of defence: every error keeps the one JSON shape
        rid = request_id(request)
        log.exception("unhandled error in %s %s (request %s)", request.method, request.url.path, rid)
        return error_response(500, f"internal error; the server log has it under request id {rid}",
                              {"request_id": rid}, headers={"X-Request-ID": rid})


OPEN_PATHS = frozenset({"/healthz", "/docs", "/openapi.json", "/docs/oauth2-redirect", "/redoc",
                        *playground.OPEN_PATHS})


@api.middleware("http")
async def _guarded(request: Request, call_next):
    """API key, rate limit and body size (:mod:`serve.guard`) before the endpoint; the request and
    its status counted (:mod:`serve.metrics`) after it."""
    response = await _check(request) or await call_next(request)
    metrics = app_metrics.current()
    if metrics is not None:
        metrics.request(request.url.path, response.status_code)
    return response


async def _check(request: Request) -> JSONResponse | None:
    guard = guards.current()
    if guard is None or request.method == "OPTIONS" or request.url.path in OPEN_PATHS:
        return None
    client, problem = guard.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
    if problem:
        return error_response(401, problem, headers={"WWW-Authenticate": "Bearer"})
    wait = guard.throttle(client or (request.client.host if request.client else "unknown"))
    if wait:
        return error_response(429, f"rate limit of {guard.rate:g} requests/s (burst {guard.burst}) exceeded; "
                              f"retry after {wait} s (serve.rate_limit_rps)", headers={"Retry-After": str(wait)})
    return None


class _BodyLimit:
    """413 for a POST body over its limit (:meth:`serve.guard.Guard.body_limit`), decided while the
    body streams in: a declared Content-Length over the limit is refused before any byte is read,
    a chunked body (no Content-Length) is counted as it arrives and refused at the first byte over
    the limit, so the ingress never holds more than the limit. The body read (at most the limit) is
    handed on to the app as it came."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        guard = guards.current()
        if guard is None or scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        path = scope["path"]
        limit = guard.body_limit(path)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return await self._refuse(scope, receive, send, f"request body is {int(declared)} bytes", limit)
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # the client went away: the app sees it as it would have
            size += len(message.get("body", b""))
            if size > limit:
                return await self._refuse(scope, receive, send, f"request body is over {limit} bytes", limit)
            if not message.get("more_body", False):
                break

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        return await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope: Any, receive: Any, send: Any, what: str, limit: int) -> None:
        path = scope["path"]
        extra = " + mixpr.max_document_bytes)" if path.endswith("/v1/longcontext") else ")"
        response = error_response(413, f"{what}; the limit is {limit} (serve.max_body_bytes{extra}",
                                  headers={"Connection": "close"})
        metrics = app_metrics.current()
        if metrics is not None:
            metrics.request(path, 413)
        await response(scope, receive, send)


class _ConfiguredCORS:
    """Starlette's CORS middleware with the origins of the running app's config (``serve.cors_origins``);
    off (no CORS headers, preflights refused by routing) while none are configured."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._cors: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        guard = guards.current()
        if guard is None or not guard.cors_origins:
            return await self.app(scope, receive, send)
        if self._cors is None:
            self._cors = CORSMiddleware(self.app, allow_origins=guard.cors_origins, allow_methods=["GET", "POST"],
                                        allow_headers=["Authorization", "Content-Type", "X-API-Key"])
        return await self._cors(scope, receive, send)


api.add_middleware(_BodyLimit)  # before the API key check: an oversized body is never held
api.add_middleware(_ConfiguredCORS)  # outermost: a 413 carries the CORS headers too
playground.install(api)  # GET /: the web playground (serve/playground.py)


ERRORS = {
    401: {"model": ErrorResponse, "description": "API keys are configured and the request has none, or a wrong one."},
    413: {"model": ErrorResponse, "description": "The body is larger than serve.max_body_bytes."},
    422: {"model": ErrorResponse, "description": "Invalid request: one message per problem in error.detail."},
    429: {"model": ErrorResponse, "description": "Rate limit exceeded; Retry-After says when to retry."},
    500: {"model": ErrorResponse, "description": "Internal error."},
    503: {"model": ErrorResponse, "description": "No shard or no replica could serve the request, or a stage "
          "failed and its retry failed too (error.detail.stage names it)."},
    504: {"model": ErrorResponse, "description": "A stage took longer than serve.timeouts (error.detail.stage)."},
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
    "reader_model": "model",
    "answer_mode": "answer_mode",
}


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1e3, 2)


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


def _extra(response: AnswerResponse) -> oai.LongRAGExtra:
    return oai.LongRAGExtra(long_answer=response.long_answer, evidence=response.evidence,
                            coverage=response.coverage, trace=response.trace)


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=128)
@serve.ingress(api)
class Ingress:
    def __init__(self, encoder: DeploymentHandle, retriever: DeploymentHandle, reader: DeploymentHandle,
                 llm: DeploymentHandle, config: LongRAGConfig, longcontext: DeploymentHandle,
                 dual: DeploymentHandle | None = None) -> None:
        self.encoder, self.retriever, self.reader, self.llm = encoder, retriever, reader, llm
        self.longcontext = longcontext
        self.dual = dual  # serve.dual.DualReader: strategy requests and the model longrag-dual
        self.config = config
        guards.install(guards.Guard(config))
        self.metrics = app_metrics.AppMetrics()
        app_metrics.install(self.metrics)
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

    async def _retrieve(self, question: str, k: int) -> tuple[Retrieval, dict[str, Any]]:
        trace: dict[str, Any] = {}
        t0 = time.perf_counter()
        t = self.config.serve.timeouts
        try:
            vector = await stages.run_stage("encode", t.encode_s, lambda: self.encoder.encode.remote(question),
                                            trace=trace)
        except BadQuestion as exc:
            raise ApiError(422, stages.one_line(exc), [f"question: {stages.one_line(exc)}"]) from None
        trace["encode_ms"] = _ms(t0)
        t1 = time.perf_counter()
        found: Retrieval = await stages.run_stage("retrieve", t.retrieve_s,
                                                  lambda: self.retriever.retrieve.remote(vector, k), trace=trace)
        trace["retrieve_ms"] = _ms(t1)
        trace.update({f"retrieve.{key}": v for key, v in found.trace.items()})
        self.metrics.retrieval(found.coverage)
        return found, trace

    def _done(self, trace: dict[str, Any], t0: float, read: ReaderResult | None = None) -> None:
        trace["total_ms"] = _ms(t0)
        self.metrics.stages(trace)
        if read is not None:
            self.metrics.llm_tokens(read.prompt_tokens, read.completion_tokens)

    @api.get("/healthz", response_model=Health, responses={503: {"model": ErrorResponse, "description":
             "Unavailable: error.detail is the Health report (deployments not running, shards without a live replica)."}})
    async def healthz(self) -> Any:
        """The build served, live replicas per shard, and every deployment that is not HEALTHY with
        Serve's reason (e.g. the resources a replica waits for)."""
        problems: list[str] = []
        deployments: dict[str, DeploymentHealth] = {}
        running: dict[str, int] = {}
        try:
            status = await asyncio.to_thread(serve_status)  # one thread at a time (serve.run.serve_status)
            app = status.applications.get(self.app_name) if self.app_name else None
        except Exception as exc:  # the controller is unreachable: say so, keep answering
            app = None
            problems.append(f"serve.status() failed: {stages.one_line(exc)}")
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

        async def ask(handle: DeploymentHandle, name: str) -> Any:
            if running.get(name, 1) == 0:
                return None
            try:
                return await asyncio.wait_for(handle.describe.remote(), 10)
            except Exception as exc:
                problems.append(f"{name}.describe failed: {stages.describe(exc)}")
                return None

        info, llm = await asyncio.gather(ask(self.retriever, "Retriever"), ask(self.llm, "LLMServer"))
        index = info.index if info is not None else []
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
            **(info.model_dump(exclude={"index"}) if info is not None else {}),
            llm=llm.name if llm is not None else None,
            index=index,
            redundancy=describe_redundancy(index),
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
        self._done(trace, t0)
        return RetrieveResponse(question=question, k=k, units=found.units, coverage=found.coverage, trace=trace)

    @api.post("/v1/answer", response_model=AnswerResponse, responses={**ERRORS, 200: {
        "description": "The answer; with \"stream\": true a text/event-stream of events: retrieval (the "
        "units found and the coverage), token (the long answer as the reader writes it, {\"text\"}), then "
        "trace (the whole AnswerResponse), or error ({\"error\"}).",
        "content": {"text/event-stream": {}}}})
    async def answer(self, req: AnswerRequest) -> Any:
        t0 = time.perf_counter()
        question, k = self._validate(req)
        found, trace = await self._retrieve(question, k)
        units = found.readable()
        if not units:
            raise ApiError(503, "no evidence could be retrieved", {"coverage": found.coverage.to_dict()})
        if req.strategy is not None:
            if req.stream:
                raise ApiError(422, "stream is not available with a strategy", ["stream: not with strategy"])
            return await self._answer_dual(req.strategy, question, found, units, trace, t0)
        if req.stream:
            return StreamingResponse(self._answer_events(question, k, found, units, req.compression, trace, t0),
                                     media_type="text/event-stream")
        t1 = time.perf_counter()
        read: ReaderResult = await stages.run_stage(
            "read", self.config.serve.timeouts.read_s,
            lambda: self.reader.read.remote(question, units, req.compression), trace=trace)
        return self._answer_response(question, found, read, trace, t0, t1)

    def _answer_response(self, question: str, found: Retrieval, read: ReaderResult, trace: dict[str, Any],
                         t0: float, t1: float) -> AnswerResponse:
        trace["read_ms"] = _ms(t1)
        trace.update({f"read.{key}": v for key, v in read.stages_ms.items()})
        trace.update({name: getattr(read, key) for name, key in _READ_TRACE.items()})
        used = set(read.units_used)
        evidence = [Evidence(unit_id=u.unit_id, titles=u.titles, score=u.score, used=u.unit_id in used)
                    for u in found.units]
        self._done(trace, t0, read)
        return AnswerResponse(question=question, answer=read.answer, long_answer=read.long_answer,
                              evidence=evidence, coverage=found.coverage, trace=trace)

    async def _read_stream(self, question: str, units: list[Any], compression: str | None):
        """The Reader's stream: the long answer's deltas (str), then the ReaderResult; retried once
        when it fails before its first delta (:func:`serve.stages.stream_stage`)."""
        async for item in stages.stream_stage(
                "read", self.config.serve.timeouts.read_s,
                lambda: self.reader.options(stream=True).read_stream.remote(question, units, compression)):
            yield item

    async def _answer_events(self, question: str, k: int, found: Retrieval, units: list[Any],
                             compression: str | None, trace: dict[str, Any], t0: float):
        yield oai.sse("retrieval", {"question": question, "k": k,
                                    "units": [u.model_dump(mode="json") for u in found.units],
                                    "coverage": found.coverage.to_dict(), "trace": dict(trace)})
        t1 = time.perf_counter()
        try:
            async for item in self._read_stream(question, units, compression):
                if isinstance(item, str):
                    yield oai.sse("token", {"text": item})
                else:
                    response = self._answer_response(question, found, item, trace, t0, t1)
                    yield oai.sse("trace", response.model_dump(mode="json"))
        except Exception as exc:  # the status line is sent: the error goes in the stream, in the one shape
            yield oai.sse("error", stages.error_event(exc))

    # ------------------------------------------------------------------ OpenAI-compatible API
    @api.get("/v1/models", response_model=oai.ModelList, responses={401: ERRORS[401], 429: ERRORS[429]})
    async def models(self) -> oai.ModelList:
        """The models of ``/v1/chat/completions`` (``available: false``: not deployed here)."""
        return oai.model_list(dual_available=self.dual is not None)

    @api.post("/v1/chat/completions", response_model=oai.ChatCompletionResponse, responses={
        **ERRORS, 404: {"model": ErrorResponse, "description": "Unknown model, or one not available here."},
        200: {"description": "The completion; with \"stream\": true server-sent chat.completion.chunk "
              "events ending with data: [DONE].", "content": {"text/event-stream": {}}}})
    async def chat_completions(self, req: oai.ChatCompletionRequest) -> Any:
        """OpenAI-compatible chat over the index (see :mod:`serve.openai_compat`)."""
        t0 = time.perf_counter()
        try:
            pipeline = oai.route_model(req.model, dual_available=self.dual is not None)
            question = req.question()
        except oai.ModelNotAvailable as exc:
            raise ApiError(404, str(exc), code="model_not_found") from None
        except InvalidRequest as exc:
            raise ApiError(422, f"invalid request: {exc}", [f"messages: {exc}"]) from None
        if req.strategy is not None and pipeline != "longrag-dual":
            raise ApiError(422, "strategy applies to model 'longrag-dual' only", ["strategy: only for longrag-dual"])
        if pipeline == "longrag-dual":
            return await self._dual_chat(req, question)
        question, k = self._validate(RetrieveRequest(question=question, k=req.k))
        found, trace = await self._retrieve(question, k)
        units = found.readable()
        if not units:
            raise ApiError(503, "no evidence could be retrieved", {"coverage": found.coverage.to_dict()})
        cid, created = oai.completion_id(), oai.now()
        if req.stream:
            return StreamingResponse(self._chat_events(cid, created, req.model, question, found, units,
                                                       req.compression, trace, t0), media_type="text/event-stream")
        t1 = time.perf_counter()
        read: ReaderResult = await stages.run_stage(
            "read", self.config.serve.timeouts.read_s,
            lambda: self.reader.read.remote(question, units, req.compression), trace=trace)
        response = self._answer_response(question, found, read, trace, t0, t1)
        return oai.ChatCompletionResponse(
            id=cid, created=created, model=req.model,
            choices=[oai.ChatChoice(message=oai.ChatCompletionMessage(content=response.answer))],
            usage=oai.Usage(prompt_tokens=read.prompt_tokens, completion_tokens=read.completion_tokens,
                            total_tokens=read.prompt_tokens + read.completion_tokens),
            longrag=_extra(response),
        )

    async def _chat_events(self, cid: str, created: int, model: str, question: str, found: Retrieval,
                           units: list[Any], compression: str | None, trace: dict[str, Any], t0: float):
        yield oai.chunk(cid, model, created, {"role": "assistant", "content": ""})
        t1 = time.perf_counter()
        try:
            async for item in self._read_stream(question, units, compression):
                if isinstance(item, str):
                    yield oai.chunk(cid, model, created, {"reasoning_content": item})
                    continue
                response = self._answer_response(question, found, item, trace, t0, t1)
                yield oai.chunk(cid, model, created, {"content": response.answer})
                usage = {"prompt_tokens": item.prompt_tokens, "completion_tokens": item.completion_tokens,
                         "total_tokens": item.prompt_tokens + item.completion_tokens}
                yield oai.chunk(cid, model, created, {}, "stop", usage=usage,
                                longrag=_extra(response).model_dump(mode="json"))
        except Exception as exc:  # the status line is sent: the error goes in the stream, in the one shape
            yield oai.data(stages.error_event(exc))
        yield oai.DONE

    async def _dual_chat(self, req: oai.ChatCompletionRequest, question: str) -> Any:
        """Model ``longrag-dual``: the dual-perspective pipeline (``self.dual``) with ``req.strategy``
        (default ``dual.strategy``) over the retrieved units. Reached only when the app was built with
        one (see :func:`serve.openai_compat.route_model`). The answer comes whole (also when streamed)."""
        t0 = time.perf_counter()
        question, k = self._validate(RetrieveRequest(question=question, k=req.k))
        found, trace = await self._retrieve(question, k)
        units = found.readable()
        if not units:
            raise ApiError(503, "no evidence could be retrieved", {"coverage": found.coverage.to_dict()})
        response = await self._answer_dual(req.strategy, question, found, units, trace, t0)
        stages = response.trace["dual"]["stages"]
        p_tok = sum(st["prompt_tokens"] for st in stages)
        c_tok = sum(st["completion_tokens"] for st in stages)
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

    async def _answer_dual(self, strategy: str | None, question: str, found: Retrieval, units: list[Any],
                           trace: dict[str, Any], t0: float) -> AnswerResponse:
        """A strategy (None: the DualReader's ``dual.strategy``) over the retrieved units' paragraphs
        (serve.dual): ``/v1/answer`` and ``longrag-dual``."""
        if self.dual is None:
            raise ApiError(503, "this app has no dual-perspective deployments (serve.dual); drop 'strategy'")
        t1 = time.perf_counter()
        try:
            res = (await stages.run_stage("dual", self.config.serve.timeouts.dual_s,
                                          lambda: self.dual.units.remote(question, units, strategy),
                                          trace=trace)).to_dict()
        except InvalidRequest as exc:
            raise ApiError(422, stages.one_line(exc), [stages.one_line(exc)]) from None
        trace["dual_ms"] = _ms(t1)
        trace["dual"] = res["trace"] | {k: res[k] for k in ("kept_chunk_ids", "global_information", "cot",
                                                             "judgements", "chunks")}  # fmt: skip
        kept = set(res["kept_chunk_ids"])
        used = {c["paragraph_id"].rsplit("/", 1)[0] for c in res["chunks"] if c["position"] in kept}
        evidence = [Evidence(unit_id=u.unit_id, titles=u.titles, score=u.score, used=u.unit_id in used)
                    for u in found.units]
        self._done(trace, t0)
        return AnswerResponse(question=question, answer=res["answer"], long_answer="", evidence=evidence,
                              coverage=found.coverage, trace=trace, strategy=res["strategy"])

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
                answer = await stages.run_stage("dual", self.config.serve.timeouts.dual_s, lambda: self.dual.document.remote(
                    req.document, req.question.strip(), req.strategy, req.k, req.retrieve_only))  # fmt: skip
                res = answer.to_dict()
            except InvalidRequest as exc:
                raise ApiError(422, stages.one_line(exc), [stages.one_line(exc)]) from None
            trace = res["trace"] | {k: res[k] for k in ("kept_chunk_ids", "global_information", "cot", "judgements")
                                    if k in res}  # fmt: skip
            return LongContextResponse(answer=res.get("answer"), route=None, strategy=req.strategy,
                                       chunks=res["chunks"], trace=trace)  # fmt: skip
        try:
            return await stages.run_stage("longcontext", self.config.serve.timeouts.longcontext_s,
                                          lambda: self.longcontext.run.remote(req))
        except InvalidRequest as exc:  # Ray re-raises the pipeline's InvalidRequest (bad k, route, ...) as one
            raise ApiError(422, stages.one_line(exc), [stages.one_line(exc)]) from None


class AppArgs(BaseModel):
    """Arguments of ``app_builder`` (the ``args:`` block of a serve config YAML)."""

    index: str = Field(..., description="Build directory or s3:// URI written by jobs.index, or a build alias "
                       "(longrag.index.alias: the app follows its current.json to new builds)")
    config: str | None = Field(None, description="LongRAGConfig YAML; default: the build's own config")
    overrides: list[str] = Field(default_factory=list, description="section.field=value overrides")


def app_builder(args: AppArgs | dict[str, Any]) -> serve.Application:
    args = AppArgs.model_validate(args) if isinstance(args, dict) else args
    if args.config:
        cfg = load_config(args.config, args.overrides)
    else:
        from longrag.index.alias import resolve_build
        from longrag.index.artifacts import ArtifactStore

        # The build's own config: the query encoder must be the model the chunks were embedded with.
        cfg = LongRAGConfig.model_validate(ArtifactStore.open(resolve_build(args.index)[0]).read_manifest().config)
        cfg = cfg.with_overrides(args.overrides)
    return build_app(cfg, args.index)


def build_app(cfg: LongRAGConfig, index: str, *, encoder_cls: Any = None, index_cls: Any = None,
              engine_cls: Any = None) -> serve.Application:
    """The application graph over the build at ``index``. The backends default to the real ones
    (see :mod:`serve.deployments`); tests inject fakes (``tests/fakes.py``)."""
    llm = LLMServer.bind(cfg.llm, engine_cls)
    return Ingress.bind(
        QueryEncoder.bind(cfg.embedding, encoder_cls),
        Retriever.bind(index, cfg.index, index_cls),
        Reader.bind(llm, cfg.llm, cfg.reader, cfg.mixpr),
        llm,
        cfg,
        LongContextReader.bind(llm, cfg.llm, cfg.mixpr, longcontext_embedding(cfg.embedding)),
        bind_dual(cfg, llm, encoder_cls),
    )
