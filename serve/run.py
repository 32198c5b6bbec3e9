"""``python -m serve.run CONFIG`` (``make serve``): deploy a Serve config and fail loudly.

It deploys like ``serve run CONFIG`` (same Ray calls: start Serve with the config's HTTP options,
submit the config), then watches ``serve.status()`` until every application is RUNNING. Ray's
``serve run`` keeps waiting forever when a deployment cannot be scheduled or fails to start (the
reason appears only as a log line); this command exits 1 and prints the reason instead:

* an application in DEPLOY_FAILED or UNHEALTHY: Serve's message (e.g. the error a replica's
  constructor raised);
* a replica that waits for resources the cluster does not have free, for longer than
  ``--schedule-timeout-s`` (default: as soon as Serve reports it, ~30 s): the missing resources
  and Serve's message, which names what each replica requires and what the cluster has. On an autoscaling cluster give new nodes time, e.g.
  ``--schedule-timeout-s 900``;
* nothing RUNNING after ``--ready-timeout-s``.

Once RUNNING it prints the URL and, unless ``--non-blocking``, serves until Ctrl-C (then shuts
Serve down, like ``serve run``).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

# Serve's status message for replicas that wait to be placed ("... taken more than 30s to be
# scheduled ... Resources required for each replica: {...}, total resources available: {...}").
# A replica with a placement group (e.g. a ray.serve.llm LLMServer) lists its bundles: [{...}, ...].
_PENDING = re.compile(r"to be scheduled.*Resources required for each replica: (\{.*?\}|\[.*?\]), "
                      r"total resources available: (\{.*?\})", re.S)


def _parse_resources(text: str) -> dict[str, float]:
    """A resource dict, or the sum of a list of placement-group bundles."""
    try:
        value = json.loads(text)
    except ValueError:
        value = ast.literal_eval(text)
    total: dict[str, float] = {}
    for bundle in value if isinstance(value, list) else [value]:
        for k, v in bundle.items():
            total[str(k)] = total.get(str(k), 0.0) + float(v)
    return total


def missing_resources(message: str) -> dict[str, float] | None:
    """From a Serve deployment message: the resources a pending replica asks for beyond what the
    cluster has free, or None when the message is not about a resource shortage (a replica also
    "waits to be scheduled" while its worker process or runtime environment starts)."""
    m = _PENDING.search(message or "")
    if not m:
        return None
    try:
        required, available = _parse_resources(m.group(1)), _parse_resources(m.group(2))
    except (ValueError, SyntaxError, AttributeError):
        return None
    short = {k: v for k, v in required.items() if v > available.get(k, 0.0) + 1e-9}
    return short or None


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


def deploy(config: dict[str, Any], address: str | None = None) -> Any:
    """Start (or reach) Serve with the config's options and submit the config; returns the schema."""
    import ray
    from ray.serve._private import api as _private_api
    from ray.serve.config import gRPCOptions
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    if not ray.is_initialized():
        ray.init(address=address, namespace="serve")
    client = _private_api.serve_start(
        http_options=schema.http_options.model_dump(),
        proxy_location=schema.proxy_location,
        grpc_options=gRPCOptions(**schema.grpc_options.model_dump()),
        controller_options=schema.controller_options,
    )
    client.deploy_apps(schema, _blocking=False)
    return schema


def wait_healthy(client: httpx.Client, timeout_s: float = 300) -> dict[str, Any]:
    """Poll ``GET /healthz`` through ``client`` until it answers 200; returns its body. Raises
    TimeoutError with the last answer (or connection error) after ``timeout_s``."""
    deadline = time.time() + timeout_s
    last = ""
    while time.time() < deadline:
        try:
            r = client.get("/healthz")
            if r.status_code == 200:
                return r.json()
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(1)
    raise TimeoutError(f"the Serve app did not become healthy in {timeout_s}s (last: {last})")


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
    import ray

    t0 = time.monotonic()
    pending_since: dict[str, float] = {}
    last_line = ""
    while True:
        status = serve_status()
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
                short = missing_resources(overview.message)
                if short:
                    pending_since.setdefault(key, time.monotonic())
                    grace = shortage_grace_s(short, ray.cluster_resources(), schedule_timeout_s)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="Serve config YAML, e.g. serve/configs/cpu.yaml")
    parser.add_argument("--address", default=None, help="Ray cluster address; default: RAY_ADDRESS or a new local Ray")
    parser.add_argument("--schedule-timeout-s", type=float, default=0.0,
                        help="fail once a replica has waited this long for resources after Serve reports it (~30 s)")
    parser.add_argument("--ready-timeout-s", type=float, default=900.0, help="fail if not RUNNING by then")
    parser.add_argument("--non-blocking", action="store_true", help="exit 0 once RUNNING, leaving the app deployed")
    args = parser.parse_args(argv)

    config = yaml.safe_load(Path(args.config).read_text())
    schema = deploy(config, args.address)
    names = [app.name for app in schema.applications]
    print(f"serve.run: submitted {args.config} (applications: {', '.join(names)})", flush=True)
    reason = wait_running(names, schedule_timeout_s=args.schedule_timeout_s, ready_timeout_s=args.ready_timeout_s)
    if reason:
        print(f"serve.run: FAILED: {reason}", file=sys.stderr, flush=True)
        return 1
    http = schema.http_options
    for app in schema.applications:
        print(f"serve.run: '{app.name}' is RUNNING at http://{http.host}:{http.port}{app.route_prefix or ''}",
              flush=True)
    if args.non_blocking:
        return 0
    from ray import serve

    try:
        while True:
            time.sleep(10)
    except KeyboardInterrupt:
        print("serve.run: shutting down", flush=True)
        serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
