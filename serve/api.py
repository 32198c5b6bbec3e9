"""The ingress' FastAPI application, built once per replica by :func:`create_api` over its
:class:`serve.gateway.Gateway`: the routers of :mod:`serve.routes`, the error handlers of
:mod:`serve.errors`, the middlewares of :mod:`serve.middleware`, the playground, and an OpenAPI
schema that states the running config's limits (at ``/docs`` and ``/openapi.json``)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from serve import playground
from serve.errors import UnhandledErrors, install_handlers
from serve.gateway import Gateway
from serve.guard import Guard
from serve.middleware import Admitted, BodyLimit, Guarded, cors
from serve.routes import ROUTERS
from serve.routes.health import PROBE_PATHS, ReadyCache
from serve.schemas import state_limits

TITLE = "LongRAG on Ray"
DESCRIPTION = ("Long retrieval units, MaxP retrieval over sharded FAISS indexes, a long reader. "
               'Every error response is {"error": {"code", "message", "detail"}}.')

#: Paths the API key check and the rate limit leave open.
OPEN_PATHS = frozenset({"/docs", "/openapi.json", "/docs/oauth2-redirect", "/redoc", *playground.OPEN_PATHS})


def create_api(gw: Gateway, guard: Guard | None = None) -> FastAPI:
    """The app of one ingress replica. ``guard`` defaults to one over ``gw.config`` (API keys from
    the config and the environment)."""
    guard = guard if guard is not None else Guard(gw.config)
    api = FastAPI(title=TITLE, version="0.1.0", description=DESCRIPTION)
    api.state.gateway = gw
    api.state.guard = guard  # /readyz shows Serve's messages to a caller with a key
    api.state.ready_cache = ReadyCache(gw, gw.config.serve.readyz_cache_s)  # /readyz's report, one per replica
    install_handlers(api)
    for router in ROUTERS:
        api.include_router(router)
    playground.install(api, guard)
    # add_middleware wraps what is there: the last added is the outermost.
    s = gw.config.serve
    api.add_middleware(Admitted, admission=gw.admission, timeout_s=s.request_timeout_s, metrics=gw.metrics)
    api.add_middleware(Guarded, guard=guard, metrics=gw.metrics, open_paths=OPEN_PATHS,
                       keyless_paths=PROBE_PATHS)
    api.add_middleware(BodyLimit, guard=guard, metrics=gw.metrics)  # before the key check: never held
    api.add_middleware(UnhandledErrors)
    cors(api, guard)  # outermost: a 413 or a 500 carries the CORS headers too
    api.openapi = _schema(api, gw)  # type: ignore[method-assign]
    return api


def _schema(api: FastAPI, gw: Gateway) -> Any:
    """The OpenAPI schema with the limits of the running config, built on first use."""
    built: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if "schema" not in built:
            schema = get_openapi(title=api.title, version=api.version, description=api.description,
                                 routes=api.routes)
            s = gw.config.serve
            built["schema"] = state_limits(schema, max_question_chars=s.max_question_chars, max_k=s.max_k,
                                           max_document_bytes=gw.config.mixpr.max_document_bytes)
        return built["schema"]

    return openapi
