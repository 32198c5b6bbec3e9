"""``GET /healthz``: the build served, live replicas per shard, and every deployment that is not
HEALTHY with Serve's reason (e.g. the resources a replica waits for)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends

from longrag.types import describe_redundancy
from serve import stages
from serve.errors import error_response
from serve.gateway import Gateway, gateway
from serve.run import Placement, missing_resources, placement, serve_status, waiting_replicas
from serve.schemas import DeploymentHealth, ErrorResponse, Health

router = APIRouter()


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


@router.get("/healthz", response_model=Health, responses={503: {"model": ErrorResponse, "description":
            "Unavailable: error.detail is the Health report (deployments not running, shards without a live replica)."}})
async def healthz(gw: Gateway = Depends(gateway)) -> Any:
    """The build served, live replicas per shard, and every deployment that is not HEALTHY with
    Serve's reason (e.g. the resources a replica waits for)."""
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
    if unavailable:
        return error_response(503, "unavailable: " + ("; ".join(problems) or "no index information"),
                              health.model_dump())
    return health
