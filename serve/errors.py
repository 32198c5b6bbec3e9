"""The API's one error shape, ``{"error": {"code", "message", "detail"}}`` (:class:`serve.schemas.ErrorResponse`):
the exception the routes raise (:class:`ApiError`), the handlers that render every other error in
the same shape, and the last line of defence for errors nobody handled (logged with the request id,
never shown to the client)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve import stages
from serve.schemas import ErrorResponse

log = logging.getLogger("ray.serve")  # Serve's replica logger: lines carry the request id

CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 408: "timeout",
         413: "payload_too_large", 422: "invalid_request", 429: "too_many_requests",
         500: "internal_error", 503: "unavailable", 504: "timeout"}

#: The error responses of the API routes, for the OpenAPI schema.
ERRORS = {
    401: {"model": ErrorResponse, "description": "API keys are configured and the request has none, or a wrong one."},
    413: {"model": ErrorResponse, "description": "The body is larger than serve.max_body_bytes."},
    422: {"model": ErrorResponse, "description": "Invalid request: one message per problem in error.detail."},
    429: {"model": ErrorResponse, "description": "Rate limit exceeded; Retry-After says when to retry."},
    500: {"model": ErrorResponse, "description": "Internal error."},
    503: {"model": ErrorResponse, "description": "No shard or no replica could serve the request, or a stage "
          "failed and its retry failed too (error.detail.stage names it), or the reader is at capacity "
          "(error.code overloaded; Retry-After says when to retry)."},
    504: {"model": ErrorResponse, "description": "A stage took longer than serve.timeouts (error.detail.stage)."},
}


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


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.detail, exc.code)


async def _stage_error(request: Request, exc: stages.StageError) -> JSONResponse:
    """A stage past its deadline (504), failed twice (503) or refused by a full queue (503 with
    ``Retry-After``), named (:mod:`serve.stages`)."""
    retry = getattr(exc, "retry_after_s", None)
    return error_response(exc.status, exc.message, exc.detail, exc.code,
                          headers={"Retry-After": str(retry)} if retry is not None else None)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with one readable message per problem (malformed JSON, missing, unknown or mistyped fields)."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        problems.append(f"{where}: {msg}")
    return error_response(422, "invalid request: " + "; ".join(problems), problems)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing errors (404, 405) and any HTTPException, in the same shape."""
    message = exc.detail if isinstance(exc.detail, str) else CODES.get(exc.status_code, "error")
    detail = None if isinstance(exc.detail, str) else exc.detail
    return error_response(exc.status_code, message, detail, headers=getattr(exc, "headers", None))


def install_handlers(api: FastAPI) -> None:
    api.add_exception_handler(ApiError, _api_error)
    api.add_exception_handler(stages.StageError, _stage_error)
    api.add_exception_handler(RequestValidationError, _validation_error)
    api.add_exception_handler(StarletteHTTPException, _http_error)


def request_id(headers: Any) -> str:
    """The id Serve's proxy gave the request (also in its ``X-Request-ID`` response header and in
    the replica's log lines), or the client's ``X-Request-ID``, or a new one."""
    try:
        from cluster import ray_private

        rid = ray_private.serve_request_id()
    except Exception:  # noqa: BLE001 - outside a replica (tests of the bare FastAPI app)
        rid = ""
    return rid or headers.get("x-request-id") or uuid.uuid4().hex


class UnhandledErrors:
    """Anything that escapes an endpoint: logged with its traceback and the request id (the
    replica's log, ``ray.serve`` logger); the client gets a JSON 500 with that id and no internals.
    When the response had already begun (a stream), the error is logged and the connection ends."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:  # the last line of defence: every error keeps the one JSON shape
            from starlette.datastructures import Headers

            rid = request_id(Headers(scope=scope))
            log.exception("unhandled error in %s %s (request %s)", scope["method"], scope["path"], rid)
            if started:
                raise
            response = error_response(500, f"internal error; the server log has it under request id {rid}",
                                      {"request_id": rid}, headers={"X-Request-ID": rid})
            await response(scope, receive, send)
