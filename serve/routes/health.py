"""Health of the ingress and what stands behind it, for probes and load balancers:

* ``GET /livez``: this ingress replica answers (no call to any deployment, no ``serve.status()``);
* ``GET /readyz``: whether this pod can answer requests (its readiness; KubeRay's readinessProbe of
  every worker group), with the cluster's state in the report. 503 only on this ingress's own
  request path: its query encoder has no running replica, or no build is loaded (the Retriever
  describes none; when its describe only timed out, a slow controller, the report carries its last
  answer instead, marked stale with its age: ``described_age_s``). The cluster's state (a shard
  without a live replica, a deployment unhealthy or waiting for resources, e.g. the LLM) makes the report ``degraded`` and stays 200: one shard down
  must not take every pod out of the Service, its requests are answered with ``degraded`` set and
  the shard named. The same report sets the metrics (:meth:`serve.metrics.AppMetrics.health`).
  Built at most once per ``serve.readyz_cache_s`` per ingress replica (concurrent probes wait for
  the one report being built), so probes cannot fan out to every shard replica;
* ``GET /healthz``: ``/readyz`` under its old name, kept for one release.

All three need no API key and are rate-limited per client address like the API (``serve.guard``).
No report carries an exception's text (it is logged with its traceback by the ingress); Serve's
own messages (a deployment's reason, the resources it waits for) are shown only to a caller with a
valid API key, or to anyone when no keys are configured.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from longrag.types import describe_redundancy
from serve.errors import error_response
from serve.gateway import Gateway, gateway
from serve.schemas import DeploymentHealth, ErrorResponse, Health, IndexDescription, Liveness
from serve.status import Placement, missing_resources, placement, serve_status, waiting_replicas

router = APIRouter()
log = logging.getLogger("ray.serve")  # Serve's replica logger: lines carry the request id

#: The probe paths: no API key, rate-limited by address (serve.api.create_api).
PROBE_PATHS = frozenset({"/livez", "/readyz", "/healthz"})
#: The deployments on every request's path from this ingress: without a running replica of one, it
#: cannot answer (absent with ``serve.colocate``: then they live in the ingress's own process).
OWN_PATH = ("QueryEncoder", "Retriever")
#: Seconds a deployment's ``describe`` may take for the report.
DESCRIBE_TIMEOUT_S = 10.0
_UNAVAILABLE = {503: {"model": ErrorResponse, "description":
                      "Not ready: this ingress cannot answer (its query encoder has no running replica, or no "
                      "build is loaded); error.detail is the Health report. A shard without a live replica or "
                      "another deployment down is not a 503: the report says degraded."}}


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


@router.get("/livez", response_model=Liveness)
async def livez(gw: Gateway = Depends(gateway)) -> Liveness:
    """This ingress replica is up and its event loop answers; nothing behind it is asked."""
    return Liveness(status="ok", app=gw.app_name)


@router.get("/readyz", response_model=Health, responses=_UNAVAILABLE)
@router.get("/healthz", response_model=Health, responses=_UNAVAILABLE, deprecated=True)  # the old name
async def readyz(request: Request) -> Any:
    """Whether this pod can answer (503 only when its query encoder has no running replica or no
    build is loaded), with the build served, live replicas per shard and every deployment that is
    not HEALTHY: the cluster's state, ``degraded`` with a 200. At most ``serve.readyz_cache_s`` old
    (``age_s``)."""
    return await request.app.state.ready_cache.get(full=_may_see_details(request))


def _may_see_details(request: Request) -> bool:
    """Whether the caller may read Serve's own messages: a valid API key, or none configured."""
    guard = getattr(request.app.state, "guard", None)
    if guard is None:
        return False
    _, problem = guard.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
    return problem is None


@dataclass
class Report:
    """One readiness report in its two forms, and whether this pod can answer."""

    full: Health  # with Serve's messages: for a caller with a key (or when no keys are configured)
    public: Health  # without them: for anyone
    ready: bool
    described: IndexDescription | None = None  # the Retriever's answer for this report (None: none, or stale)


class ReadyCache:
    """The last readiness report of this ingress replica, rebuilt when older than ``ttl_s``; one
    build at a time, and the probes that arrive meanwhile get its result. It also keeps the
    Retriever's last answer (:func:`report` falls back on it when a describe times out)."""

    def __init__(self, gw: Gateway, ttl_s: float) -> None:
        self.gw, self.ttl_s = gw, ttl_s
        self._lock = asyncio.Lock()
        self._report: tuple[float, Report] | None = None  # (built at, report)
        self._described: tuple[float, IndexDescription] | None = None  # (answered at, the Retriever's last answer)

    async def get(self, full: bool = False) -> Any:
        async with self._lock:
            now = time.monotonic()
            if self._report is None or now - self._report[0] >= self.ttl_s:
                built = await report(self.gw, self._described)
                self.gw.metrics.health(built.full)
                self._report = (time.monotonic(), built)
                if built.described is not None:
                    self._described = (time.monotonic(), built.described)
            at, built = self._report
        health = (built.full if full else built.public).model_copy(update={"age_s": round(time.monotonic() - at, 3)})
        if not built.ready:
            return error_response(503, "not ready: " + ("; ".join(health.problems) or "no index information"),
                                  health.model_dump())
        return JSONResponse(health.model_dump(mode="json"))


async def report(gw: Gateway, last_described: tuple[float, IndexDescription] | None = None) -> Report:
    """The readiness report now. Not ready: a deployment of :data:`OWN_PATH` without a running
    replica, or no build described by the Retriever; anything else found is a problem of the
    cluster (``degraded``). When the Retriever's describe times out (it reads Serve's status: a slow
    controller), ``last_described`` (``(time.monotonic() when answered, its answer)``) stands in for
    it, marked stale (``described_age_s``, and a problem saying so): the build is still loaded. An
    exception's text is logged, never put in the report."""
    problems: list[tuple[str, str]] = []  # (public line, line with Serve's messages)
    not_ready: list[str] = []
    deployments: dict[str, DeploymentHealth] = {}
    running: dict[str, int] = {}
    where: Placement | None = None  # Serve's details and the cluster's resources, read once if needed
    try:
        status = await asyncio.to_thread(serve_status)  # one thread at a time (serve.status.serve_status)
        app = status.applications.get(gw.app_name) if gw.app_name else None
    except Exception:  # the controller is unreachable: say so, keep answering
        log.warning("/readyz: serve.status() failed", exc_info=True)
        app = None
        problems.append(("serve.status() failed (the ingress log has the error)",) * 2)
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
            line = f"{name}: {_value(d.status)}, {running[name]} running"
            problems.append((line, line + (f", lacks {short}" if short else "") + (f": {d.message}" if d.message else "")))
            if running[name] == 0 and name in OWN_PATH:
                not_ready.append(f"{name}: no running replica")

    stale_s: list[float] = []  # the age of the Retriever's last answer, when it stands in for a timed-out one

    async def ask(handle: Any, name: str, last: tuple[float, Any] | None = None) -> Any:
        if running.get(name, 1) == 0:
            return None
        try:
            return await asyncio.wait_for(handle.describe.remote(), DESCRIBE_TIMEOUT_S)
        except TimeoutError:
            line = f"{name}.describe timed out after {DESCRIBE_TIMEOUT_S:g} s"
            if last is not None:
                stale_s.append(round(time.monotonic() - last[0], 3))
                line += f": its answer of {stale_s[0]:.0f} s ago is shown (stale)"
                problems.append((line, line))
                return last[1]
        except Exception:
            log.warning("/readyz: %s.describe failed", name, exc_info=True)
            line = f"{name}.describe failed (the ingress log has the error)"
        problems.append((line, line))
        return None

    info, llm = await asyncio.gather(ask(gw.retriever, "Retriever", last_described), ask(gw.llm, "LLMServer"))
    index = info.index if info is not None else []
    if info is None:
        not_ready.append("no build loaded (the Retriever describes none)")
    for row in index:
        if row.live == 0:
            problems.append((f"shard {row.shard}: no live replica",) * 2)
        elif row.live < row.replicas:
            problems.append((f"shard {row.shard}: {row.live} of {row.replicas} replicas live",) * 2)
    s = gw.config.serve
    full = Health(
        status="unavailable" if not_ready else ("degraded" if problems else "ok"),
        **(info.model_dump(exclude={"index"}) if info is not None else {}),
        llm=llm.name if llm is not None else None,
        index=index,
        redundancy=describe_redundancy(index),
        deployments=deployments,
        problems=not_ready + [line for _, line in problems],
        limits={"max_question_chars": s.max_question_chars, "max_k": s.max_k, "default_k": s.default_k},
        described_age_s=stale_s[0] if stale_s else None,
    )
    public = full.model_copy(update={
        "deployments": {n: d.model_copy(update={"message": "", "missing_resources": None}) for n, d in deployments.items()},
        "problems": not_ready + [line for line, _ in problems],
    })
    return Report(full=full, public=public, ready=not not_ready, described=None if stale_s else info)
