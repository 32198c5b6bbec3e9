"""The web playground: ``GET /`` on the ingress serves a small static page (``serve/static``: HTML,
plain JavaScript and CSS, no build step) that talks to the app's own API.

The page asks a question (unit count ``k``, LongRAG's streamed two-turn reader or a dual-perspective
strategy), streams the answer from ``POST /v1/answer`` (``"stream": true``), shows the evidence
units (titles, scores, which the reader used, each unit's best chunk) and the per-stage trace as a
bar; a second tab sends a long document and a question to ``POST /v1/longcontext`` (MixPR).

The page and its files are open (no API key needed to load them); the API calls it makes carry
the key typed into its key field, which it shows when ``GET /playground/config`` says the app has
API keys (``serve.api_keys``). That endpoint says only whether keys are needed, never a key.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve.guard import Guard

STATIC = Path(__file__).resolve().parent / "static"
#: The files under /static/ and their media types (nothing else is served from the folder).
FILES = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
#: Paths the guard leaves open (the page must load before a key is typed in).
OPEN_PATHS = frozenset({"/", "/playground/config", *(f"/static/{name}" for name in FILES)})


def install(api: FastAPI, guard: Guard) -> None:
    """Add the playground's routes to the ingress app (left out of the OpenAPI schema)."""

    @api.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    @api.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in FILES:
            raise StarletteHTTPException(404, f"no static file {name!r}; there are {sorted(FILES)}")
        return Response((STATIC / name).read_bytes(), media_type=FILES[name])

    @api.get("/playground/config", include_in_schema=False)
    async def config() -> dict[str, bool]:
        return {"api_keys": bool(guard.keys)}
