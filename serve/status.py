"""Serve's status as the runtime reads it: ``serve.status()`` one thread at a time, the replicas
running, waiting until applications run (or saying why they never will: a deployment failed, or a
replica waits for resources the cluster does not have, read from structured data). The index
application (:mod:`serve.index_app`), the health routes (:mod:`serve.routes.health`) and the CLI
(:mod:`serve.run`, which re-exports these) use it; no Ray at import.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from cluster import ray_private

log = logging.getLogger(__name__)

def _serve_slow_startup_s() -> float:
    """Serve's own threshold for a replica "slow to be scheduled" (``RAY_SERVE_SLOW_STARTUP_WARNING_S``)."""
    try:
        return float(os.environ.get("RAY_SERVE_SLOW_STARTUP_WARNING_S",
                                    os.environ.get("SERVE_SLOW_STARTUP_WARNING_S", 30)))
    except ValueError:
        return 30.0


#: A replica counts as waiting for resources once it has been this long without a node. Serve reports
#: such a replica in its deployment message after ``RAY_SERVE_SLOW_STARTUP_WARNING_S`` (30 s); a few
#: seconds more and that message (what the replica requires, what the cluster has) is there to show
#: beside ours, and a replica placed a moment ago (its resources taken, its worker still starting:
#: no node_id yet either) is not reported as short of them (a worker slower than that still may be:
#: wait_running gives a shortage the cluster could meet TRANSIENT_GRACE_S).
PLACEMENT_WAIT_S = _serve_slow_startup_s() + 5.0

_PLACED_STATES = ("RUNNING", "STOPPING", "STOPPED", "PENDING_MIGRATION")


def short_of(ask: Mapping[str, float], free: Mapping[str, float]) -> dict[str, float] | None:
    """The resources of one replica's ``ask`` that ``free`` (what the cluster has unreserved) does not
    cover, with the amount asked (``{"CPU": 3.0}``), or None when the ask fits. A zero ask never is
    short, a resource the cluster has none of always is. Ray-free."""
    short = {str(k): float(v) for k, v in ask.items() if float(v) > 0 and float(v) > float(free.get(k, 0.0)) + 1e-9}
    return short or None


def _bundles_total(bundles: Any) -> dict[str, float]:
    """The sum of a placement group's bundles (``{index: {resource: amount}}`` or a list of them)."""
    total: dict[str, float] = {}
    for bundle in bundles.values() if isinstance(bundles, Mapping) else bundles:
        for k, v in bundle.items():
            total[str(k)] = total.get(str(k), 0.0) + float(v)
    return total


def waiting_ask(deployment: Mapping[str, Any], *, now: float, wait_s: float = PLACEMENT_WAIT_S,
                groups: Mapping[str, tuple[str, dict[str, float]]] | None = None) -> dict[str, float] | None:
    """From one deployment of Serve's details (``DeploymentDetails`` as a dict): what one of its
    replicas asks for, when a replica has waited at least ``wait_s`` to be placed (not RUNNING, no
    node yet: Serve fills ``node_id`` once the replica's actor is up), else None. The ask is Serve's
    ``required_resources`` (the replica actor's CPU, GPU, memory and custom resources, Serve's default
    of 1 CPU included); a replica with a placement group (``groups``: ``{name: (state, summed
    bundles)}``, Serve names the group after the replica's actor) asks for the sum of its bundles while
    the group is PENDING, and for nothing once the group holds them. Ray-free."""
    groups = groups or {}
    for replica in deployment.get("replicas") or []:
        if _value(replica.get("state")) in _PLACED_STATES or replica.get("node_id"):
            continue
        started = float(replica.get("start_time_s") or 0.0)
        if started <= 0 or now - started < wait_s:
            continue
        group = groups.get(str(replica.get("actor_name")))
        if group is None:
            return {str(k): float(v) for k, v in (deployment.get("required_resources") or {}).items()}
        if group[0] == "PENDING":
            return dict(group[1])
    return None


class Placement(NamedTuple):
    """What placing a replica depends on, read at one time: Serve's details of its applications
    (``ServeInstanceDetails.applications`` as dicts), the cluster's free and total resources and its
    placement groups (``{name: (state, summed bundles)}``)."""

    applications: Mapping[str, Any]
    free: Mapping[str, float]
    total: Mapping[str, float]
    groups: Mapping[str, tuple[str, dict[str, float]]]
    now: float


def placement() -> Placement:
    """Read a :class:`Placement` now; what cannot be read is left empty (logged at debug)."""
    import ray

    applications: Mapping[str, Any] = {}
    free: Mapping[str, float] = {}
    total: Mapping[str, float] = {}
    groups: dict[str, tuple[str, dict[str, float]]] = {}
    try:
        applications = ray_private.serve_details().get("applications") or {}
    except Exception as exc:
        log.debug("serve.status: Serve's details cannot be read: %r", exc)
    try:
        free, total = ray.available_resources(), ray.cluster_resources()
    except Exception as exc:
        log.debug("serve.status: the cluster's resources cannot be read: %r", exc)
    try:
        from ray.util import placement_group_table

        for pg in placement_group_table().values():
            if pg.get("name") and pg.get("state") != "REMOVED":
                groups[pg["name"]] = (str(pg.get("state")), _bundles_total(pg.get("bundles") or {}))
    except Exception as exc:
        log.debug("serve.status: the placement groups cannot be read: %r", exc)
    return Placement(applications, free, total, groups, time.time())


def missing_resources(app_name: str, deployment: str, where: Placement | None = None) -> dict[str, float] | None:
    """The resources a replica of ``app_name``'s ``deployment`` waits for beyond what the cluster has
    free (``{"CPU": 3.0}``: the per-replica ask that does not fit), or None: no replica has waited
    :data:`PLACEMENT_WAIT_S` to be placed, or its ask fits (it waits for something else, e.g. its
    worker process or runtime environment), or the deployment's details cannot be read (logged at debug)."""
    where = where if where is not None else placement()
    try:
        details = where.applications[app_name]["deployments"][deployment]
        ask = waiting_ask(details, now=where.now, groups=where.groups)
        return short_of(ask, where.free) if ask else None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        log.debug("serve.status: no details of deployment %s/%s: %r", app_name, deployment, exc)
        return None


def waiting_replicas(overview: Any) -> bool:
    """Whether a deployment of ``serve.status()`` has replicas that are not RUNNING."""
    return any(_value(state) != "RUNNING" and n for state, n in overview.replica_states.items())


#: A replica short of a resource the cluster has in total (other replicas hold it while they start,
#: or release it soon) is given at least this long before it counts as unschedulable.
TRANSIENT_GRACE_S = 120.0


def shortage_grace_s(short: dict[str, float], total: dict[str, float], schedule_timeout_s: float) -> float:
    """How long a replica short of ``short`` may wait before it counts as unschedulable: the
    ``schedule_timeout_s`` when the cluster does not have that much in total (it never will,
    unless an autoscaler adds nodes), at least :data:`TRANSIENT_GRACE_S` when it does (the
    resources are only held by other replicas for now: on a loaded machine, workers start slowly)."""
    fits = all(v <= total.get(k, 0.0) + 1e-9 for k, v in short.items())
    return max(schedule_timeout_s, TRANSIENT_GRACE_S) if fits else schedule_timeout_s


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


# serve.status() is not safe in two threads at once (Ray 2.60: building an AutoscalingConfig
# registers and unregisters its policy module with cloudpickle, and the second thread's unregister
# raises "is not registered for pickle by value")
_STATUS_LOCK = threading.Lock()


def serve_status() -> Any:
    """``serve.status()``, one thread at a time."""
    from ray import serve

    with _STATUS_LOCK:
        return serve.status()


def running_replicas(app_name: str) -> dict[str, int]:
    """``{deployment: RUNNING replicas}`` of one application now (empty when it is not deployed)."""
    app = serve_status().applications.get(app_name)
    return {name: sum(n for state, n in d.replica_states.items() if _value(state) == "RUNNING")
            for name, d in (app.deployments.items() if app else [])}


def wait_running(app_names: list[str], *, schedule_timeout_s: float = 0.0, ready_timeout_s: float = 900.0,
                 poll_s: float = 2.0, log=print) -> str | None:
    """Wait until every app is RUNNING. Returns None then, else the reason it never will be."""
    t0 = time.monotonic()
    pending_since: dict[str, float] = {}
    last_line = ""
    while True:
        status = serve_status()
        where: Placement | None = None  # read once per poll, when a deployment has replicas not RUNNING
        states, problems = [], []
        for name in app_names:
            app = status.applications.get(name)
            if app is None:
                states.append(f"{name}: NOT_STARTED")
                continue
            app_status = _value(app.status)
            states.append(f"{name}: {app_status}")
            if app_status in ("DEPLOY_FAILED", "UNHEALTHY"):
                details = [f"{d}: {_value(o.status)}: {o.message}" for d, o in app.deployments.items() if o.message]
                return f"application '{name}' is {app_status}: {app.message}" + "".join(f"\n  {x}" for x in details)
            for dep, overview in app.deployments.items():
                key = f"{name}/{dep}"
                short = None
                if waiting_replicas(overview):
                    if where is None:
                        where = placement()
                    short = missing_resources(name, dep, where)
                if short and where is not None:
                    pending_since.setdefault(key, time.monotonic())
                    grace = shortage_grace_s(short, where.total, schedule_timeout_s)
                    if time.monotonic() - pending_since[key] >= grace:
                        problems.append(f"application '{name}', deployment '{dep}' lacks {short}: {overview.message}")
                else:
                    pending_since.pop(key, None)
        if problems:
            return "a deployment cannot be scheduled (its replicas wait for resources the cluster does not have):\n  " \
                + "\n  ".join(problems)
        if all(s.endswith(": RUNNING") for s in states):
            return None
        if time.monotonic() - t0 > ready_timeout_s:
            return f"not RUNNING after {ready_timeout_s:.0f}s: {', '.join(states)}"
        line = ", ".join(states)
        if line != last_line:
            log(f"serve.run: {line}")
            last_line = line
        time.sleep(poll_s)
