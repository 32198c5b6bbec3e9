"""The ingress' ASGI middlewares, each given the replica's :class:`serve.guard.Guard` (and metrics):

* :class:`Guarded`: API key and rate limit before the endpoint, the request and its status counted after;
* :class:`BodyLimit`: 413 for a POST body over its limit, decided while the body streams in;
* :class:`Admitted`: every request's deadline (``serve.request_timeout_s``, ``X-Request-Timeout``),
  and the reader's requests admitted or refused at once (503 + ``Retry-After``,
  ``serve.max_reader_requests``) before any stage runs; requests whose client went away counted;
* :func:`cors`: Starlette's CORS middleware with ``serve.cors_origins``, left out while none are configured.

Plain ASGI callables, not ``@app.middleware("http")`` functions: those run every request through
Starlette's ``BaseHTTPMiddleware`` (a task and a memory stream per request and per middleware).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware

from longrag.admission import Admission, Deadline, Overloaded, parse_timeout_header
from serve import stages
from serve.errors import error_response
from serve.guard import Guard
from serve.metrics import AppMetrics


class SentStatus:
    """An ASGI ``send`` that remembers the status of the response sent through it (0 until it starts)."""

    def __init__(self, send: Any) -> None:
        self._send, self.status = send, 0

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)


def route_path(scope: Any) -> str:
    """The path the app routes on: without the application's route prefix (``root_path``)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] or "/" if root and path.startswith(root) else path


class Guarded:
    """API key and rate limit (:mod:`serve.guard`) for every route but ``open_paths``; the rate
    limit alone, per client address, for ``keyless_paths`` (the health probes: a load balancer has
    no key, and no one may flood them); every HTTP request's route and status counted
    (:class:`serve.metrics.AppMetrics`, or the gateway's no-op)."""

    def __init__(self, app: Any, guard: Guard, metrics: AppMetrics, open_paths: frozenset[str],
                 keyless_paths: frozenset[str] = frozenset()) -> None:
        self.app, self.guard, self.metrics = app, guard, metrics
        self.open_paths, self.keyless_paths = open_paths, keyless_paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refused = self._check(scope)
        if refused is not None:
            await refused(scope, receive, send)
            self.metrics.request(route_path(scope), refused.status_code)
            return
        sent = SentStatus(send)
        try:
            await self.app(scope, receive, sent)
        finally:
            self.metrics.request(route_path(scope), sent.status or 500)

    def _check(self, scope: Any) -> Any:
        guard, path = self.guard, route_path(scope)
        if scope["method"] == "OPTIONS" or path in self.open_paths or not (guard.keys or guard.rate):
            return None
        client = None
        if path not in self.keyless_paths:
            headers = Headers(scope=scope)
            client, problem = guard.authenticate(headers.get("authorization"), headers.get("x-api-key"))
            if problem:
                return error_response(401, problem, headers={"WWW-Authenticate": "Bearer"})
        address = scope.get("client")
        wait = guard.throttle(client or (address[0] if address else "unknown"))
        if wait:
            return error_response(429, f"rate limit of {guard.rate:g} requests/s (burst {guard.burst}) exceeded; "
                                  f"retry after {wait} s (serve.rate_limit_rps)", headers={"Retry-After": str(wait)})
        return None


class BodyLimit:
    """413 for a POST body over its limit (:meth:`serve.guard.Guard.body_limit`), decided while the
    body streams in: a declared Content-Length over the limit is refused before any byte is read,
    a chunked body (no Content-Length) is counted as it arrives and refused at the first byte over
    the limit, so the ingress never holds more than the limit. The body read (at most the limit) is
    handed on to the app as it came."""

    def __init__(self, app: Any, guard: Guard, metrics: AppMetrics) -> None:
        self.app, self.guard, self.metrics = app, guard, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        limit = self.guard.body_limit(route_path(scope))
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
        if declared.isdigit():
            if int(declared) > limit:
                return await self._refuse(scope, receive, send, f"request body is {int(declared)} bytes", limit)
            return await self.app(scope, receive, send)  # the server stops reading at Content-Length
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

    async def _refuse(self, scope: Any, receive: Any, send: Any, what: str, limit: int) -> None:
        path = route_path(scope)
        extra = " + mixpr.max_document_bytes)" if path == "/v1/longcontext" else ")"
        response = error_response(413, f"{what}; the limit is {limit} (serve.max_body_bytes{extra}",
                                  headers={"Connection": "close"})
        self.metrics.request(path, 413)
        await response(scope, receive, send)


log = logging.getLogger("ray.serve")

#: The routes that need the reader (its LLM): admitted by :class:`Admitted`.
READER_PATHS = frozenset({"/v1/answer", "/v1/chat/completions", "/v1/longcontext"})


class Admitted:
    """A deadline for every HTTP request, and admission for the reader's (:mod:`longrag.admission`).

    The deadline is ``serve.request_timeout_s`` from now, or the client's ``X-Request-Timeout``
    when shorter (a value that is not a positive number: 422); the stages read it
    (:data:`serve.stages.request_deadline`). A request to one of :data:`READER_PATHS` takes a place
    in ``admission`` or is answered 503 with ``Retry-After`` at once, before its body is read or any
    stage runs; it holds the place until its response is sent (a stream: its last event) or its
    client goes away. A request cancelled under it (Serve cancels the request when its client
    disconnects) is counted (``metrics.cancelled``) and its place freed."""

    def __init__(self, app: Any, admission: Admission, timeout_s: float, metrics: AppMetrics,
                 paths: frozenset[str] = READER_PATHS) -> None:
        self.app, self.admission, self.timeout_s, self.metrics, self.paths = app, admission, timeout_s, metrics, paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = route_path(scope)
        try:
            timeout_s = parse_timeout_header(Headers(scope=scope).get("x-request-timeout"), self.timeout_s)
        except ValueError as exc:
            return await error_response(422, str(exc), ["X-Request-Timeout: " + str(exc)])(scope, receive, send)
        token = stages.request_deadline.set(Deadline.after(timeout_s))
        try:
            if scope["method"] != "POST" or path not in self.paths:
                return await self.app(scope, receive, send)
            try:
                ticket = self.admission.enter()
            except Overloaded as exc:
                self.metrics.shed(path)
                detail = {"in_flight": exc.in_flight, "limit": exc.limit, "retry_after_s": exc.retry_after_s}
                return await error_response(
                    503, f"{exc} (serve.max_reader_requests, serve.max_reader_wait_s)", detail,
                    code="overloaded", headers={"Retry-After": str(exc.retry_after_s)})(scope, receive, send)
            sent = SentStatus(send)
            completed = False
            try:
                await self.app(scope, receive, sent)
                completed = 200 <= sent.status < 400  # an answer: the reader's pace (not a timeout's, not an error's)
            except asyncio.CancelledError:
                self.metrics.cancelled(path)
                log.info("%s cancelled: its client went away or its deadline passed", path)
                raise
            finally:
                self.admission.leave(ticket, completed=completed)
        finally:
            stages.request_deadline.reset(token)


def cors(api: Any, guard: Guard) -> None:
    """Starlette's CORS middleware with the config's origins (``serve.cors_origins``); none added
    (no CORS headers, preflights refused by routing) while none are configured."""
    if guard.cors_origins:
        api.add_middleware(CORSMiddleware, allow_origins=guard.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-API-Key"])
