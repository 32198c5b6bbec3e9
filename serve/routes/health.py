"""Health of the ingress and what stands behind it, for probes and load balancers:

* ``GET /livez``: this ingress replica answers (no call to any deployment, no ``serve.status()``);
* ``GET /readyz``: the build served, live replicas per shard, and every deployment that is not
  HEALTHY with Serve's reason (e.g. the resources a replica waits for); 503 when requests cannot
  be answered. Built at most once per ``serve.readyz_cache_s`` per ingress replica (concurrent
  probes wait for the one report being built), so probes cannot fan out to every shard replica;
* ``GET /healthz``: ``/readyz`` under its old name, kept for one release.

All three need no API key and are rate-limited per client address like the API (``serve.guard``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from longrag.types import describe_redundancy
from serve import stages
from serve.errors import error_response
from serve.gateway import Gateway, gateway
from serve.run import Placement, missing_resources, placement, serve_status, waiting_replicas
from serve.schemas import DeploymentHealth, ErrorResponse, Health, Liveness

router = APIRouter()

#: The probe paths: no API key, rate-limited by address (serve.api.create_api).
PROBE_PATHS = frozenset({"/livez", "/readyz", "/healthz"})
_UNAVAILABLE = {503: {"model": ErrorResponse, "description":
                      "Unavailable: error.detail is the Health report (deployments not running, shards without a "
                      "live replica)."}}


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


@router.get("/livez", response_model=Liveness)
async def livez(gw: Gateway = Depends(gateway)) -> Liveness:
    """This ingress replica is up and its event loop answers; nothing behind it is asked."""
    return Liveness(status="ok", app=gw.app_name)


@router.get("/readyz", response_model=Health, responses=_UNAVAILABLE)
@router.get("/healthz", response_model=Health, responses=_UNAVAILABLE, deprecated=True)  # the old name
async def readyz(request: Request) -> Any:
    """The build served, live replicas per shard, and every deployment that is not HEALTHY with
    Serve's reason (e.g. the resources a replica waits for); 503 when requests cannot be answered.
    At most ``serve.readyz_cache_s`` old (``age_s``)."""
    return await request.app.state.ready_cache.get()


class ReadyCache:
    """The last readiness report of this ingress replica, rebuilt when older than ``ttl_s``; one
    build at a time, and the probes that arrive meanwhile get its result."""

    def __init__(self, gw: Gateway, ttl_s: float) -> None:
        self.gw, self.ttl_s = gw, ttl_s
        self._lock = asyncio.Lock()
        self._report: tuple[float, Health, bool] | None = None  # (built at, report, unavailable)

    async def get(self) -> Any:
        async with self._lock:
            now = time.monotonic()
            if self._report is None or now - self._report[0] >= self.ttl_s:
                health, unavailable = await report(self.gw)
                self._report = (time.monotonic(), health, unavailable)
            built, health, unavailable = self._report
        health = health.model_copy(update={"age_s": round(time.monotonic() - built, 3)})
        if unavailable:
            return error_response(503, "unavailable: " + ("; ".join(health.problems) or "no index information"),
                                  health.model_dump())
        return JSONResponse(health.model_dump(mode="json"))


async def report(gw: Gateway) -> tuple[Health, bool]:
    """The readiness report now, and whether requests cannot be answered (503)."""
    problems: list[str] = []
    deployments: dict[str, DeploymentHealth] = {}
    running: dict[str, int] = {}
    where: Placement | None = None  # Serve's details and the cluster's resources, read once if needed
    try:
        status = await asyncio.to_thread(serve_status)  # one thread at a time (serve.run.serve_status)
        app = status.applications.get(gw.app_name) if gw.app_name else None
    except Exception as exc:  # the controller is unreachable: say so, keep answering
        app = None
        problems.append(f"serve.status() failed: {stages.one_line(exc)}")
    for name, d in (app.deployments.items() if app else []):
        states = {_value(k): v for k, v in d.replica_states.items()}
        running[name] = states.get("RUNNING", 0)
        if _value(d.status) != "HEALTHY" or running[name] == 0:
            short = None
            if gw.app_name and waiting_replicas(d):  # from structured data; d.message is only shown
                if where is None:
                    where = await asyncio.to_thread(placement)
                short = missing_resources(gw.app_name, name, where)
            deployments[name] = DeploymentHealth(status=_value(d.status), running_replicas=running[name],
                                                 message=d.message or "", missing_resources=short)
            problems.append(f"{name}: {_value(d.status)}, {running[name]} running"
                            + (f", lacks {short}" if short else "") + (f": {d.message}" if d.message else ""))
    unavailable = any(n == 0 for n in running.values())

    async def ask(handle: Any, name: str) -> Any:
        if running.get(name, 1) == 0:
            return None
        try:
            return await asyncio.wait_for(handle.describe.remote(), 10)
        except Exception as exc:
            problems.append(f"{name}.describe failed: {stages.describe(exc)}")
            return None

    info, llm = await asyncio.gather(ask(gw.retriever, "Retriever"), ask(gw.llm, "LLMServer"))
    index = info.index if info is not None else []
    if info is None:
        unavailable = True
    for row in index:
        if row.live == 0:
            unavailable = True
            problems.append(f"shard {row.shard}: no live replica")
        elif row.live < row.replicas:
            problems.append(f"shard {row.shard}: {row.live} of {row.replicas} replicas live")
    s = gw.config.serve
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
    return health, unavailable
