"""``python -m serve.run CONFIG`` (``make serve``): deploy a Serve config and fail loudly.

It deploys like ``serve run CONFIG`` (same Ray calls: start Serve with the config's HTTP options,
submit the config), then watches ``serve.status()`` until every application is RUNNING. Ray's
``serve run`` keeps waiting forever when a deployment cannot be scheduled or fails to start (the
reason appears only as a log line); this command exits 1 and prints the reason instead:

* an application in DEPLOY_FAILED or UNHEALTHY: Serve's message (e.g. the error a replica's
  constructor raised);
* a replica that waits for resources the cluster does not have free, for longer than
  ``--schedule-timeout-s`` (default: as soon as it has waited ~35 s to be placed): the missing
  resources and Serve's message, which names what each replica requires and what the cluster has.
  The missing resources come from structured data, never from that message's text: Serve's details
  of the deployment (its replicas' states and nodes, the per-replica ``required_resources``, a
  replica's placement group) against ``ray.available_resources()``. On an autoscaling cluster give
  new nodes time, e.g. ``--schedule-timeout-s 900``;
* nothing RUNNING after ``--ready-timeout-s``.

Once RUNNING it prints the URL and, unless ``--non-blocking``, serves until Ctrl-C (then shuts
Serve down, like ``serve run``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from cluster import ray_private
from longrag import scoped
from serve.status import (  # noqa: F401 - the CLI's, and re-exported for jobs and tests
    PLACEMENT_WAIT_S,
    TRANSIENT_GRACE_S,
    Placement,
    missing_resources,
    placement,
    running_replicas,
    serve_status,
    short_of,
    shortage_grace_s,
    wait_running,
    waiting_ask,
    waiting_replicas,
)


def direct_ingress_env(port: int, ingress_apps: int = 1) -> dict[str, str]:
    """The environment of Ray Serve's direct ingress (a Ray 2.60 feature flag, read when Ray's
    processes start, so it must be in the environment of the process that starts a local Ray, or of
    ``ray start`` on a cluster): each ingress application's replica serves HTTP itself, on ports
    ``port`` .. ``port + ingress_apps - 1`` in the order the applications are deployed, instead of
    behind Serve's proxy (one process and one hop less: Serve's floor here 2.3 ms p50 against 12.6
    through the proxy). Serve keeps its proxy on the head node; :func:`deploy` moves it to
    ``port + ingress_apps``.

    For one replica of each ingress per machine (the single-machine profile, ``cpu.yaml``): a
    second replica of an ingress on the same node finds no free port in the range."""
    if ingress_apps < 1:
        raise ValueError(f"ingress_apps must be >= 1, got {ingress_apps}")
    return {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + ingress_apps)}


def direct_ingress(port: int, ingress_apps: int = 1) -> Any:
    """:func:`direct_ingress_env` in this process's environment for a ``with`` block (a local Ray
    started in it keeps it), restored after."""
    return scoped.environ(direct_ingress_env(port, ingress_apps))


def direct_ingress_proxy_port() -> int | None:
    """Where Serve's proxy goes when this process's environment turns direct ingress on (the end of
    the replicas' port range, :func:`direct_ingress_env`); None when it is off."""
    if os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") != "1":
        return None
    return int(os.environ.get("RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT", "31000"))


def deploy(config: dict[str, Any], address: str | None = None) -> Any:
    """Start (or reach) Serve with the config's options and submit the config; returns the schema.
    Under direct ingress (:func:`direct_ingress_env` in this process's environment) the config's
    HTTP port is the ingress replicas' and Serve's proxy listens after their range."""
    import ray
    from ray.serve.config import gRPCOptions
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    proxy_port = direct_ingress_proxy_port()
    if proxy_port is not None:
        schema.http_options.port = proxy_port
    if not ray.is_initialized():
        ray.init(address=address, namespace="serve")
    client = ray_private.serve_start(
        http_options=schema.http_options.model_dump(),
        proxy_location=schema.proxy_location,
        grpc_options=gRPCOptions(**schema.grpc_options.model_dump()),
        controller_options=schema.controller_options,
    )
    ray_private.deploy_apps_nowait(client, schema)
    return schema


def readiness(r: httpx.Response) -> dict[str, Any]:
    """The Health report of a ``/readyz`` answer: a 200's body, a 503's ``error.detail`` (``{}``
    when it has none). Its ``age_s`` says how long ago the ingress built it."""
    body = r.json()
    return body if r.status_code == 200 else (body.get("error", {}).get("detail") or {})


def wait_healthy(client: httpx.Client, timeout_s: float = 300, status: str | None = None) -> dict[str, Any]:
    """Poll ``GET /readyz`` through ``client`` until it answers 200 (and, with ``status``, its report
    says that status: "ok" = every replica of every shard live); returns its body. Raises
    TimeoutError with the last answer (or connection error) after ``timeout_s``."""
    deadline = time.time() + timeout_s
    last = ""
    while time.time() < deadline:
        try:
            r = client.get("/readyz")
            if r.status_code == 200 and status in (None, r.json().get("status")):
                return r.json()
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(1)
    raise TimeoutError(f"the Serve app did not become healthy in {timeout_s}s (last: {last})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="Serve config YAML, e.g. serve/configs/cpu.yaml")
    parser.add_argument("--address", default=None, help="Ray cluster address; default: RAY_ADDRESS or a new local Ray")
    parser.add_argument("--schedule-timeout-s", type=float, default=0.0,
                        help="fail once a replica short of resources has waited this long more (it counts as "
                             "short after waiting ~35 s to be placed)")
    parser.add_argument("--ready-timeout-s", type=float, default=900.0, help="fail if not RUNNING by then")
    parser.add_argument("--non-blocking", action="store_true", help="exit 0 once RUNNING, leaving the app deployed")
    parser.add_argument("--direct-ingress", action="store_true",
                        help="the Ingress replica serves the config's HTTP port itself, without Serve's proxy "
                             "(a new local Ray, one application, one Ingress replica: the single-machine profile)")
    parser.add_argument("--quiet-ray", action="store_true",
                        help="a new local Ray whose bookkeeping runs at single-machine rates "
                             "(cluster.local.QUIET_RAY_ENV: the LLM's threads keep the cores)")
    args = parser.parse_args(argv)

    config = yaml.safe_load(Path(args.config).read_text())
    port = int(config.get("http_options", {}).get("port", 8000))
    if args.direct_ingress:
        if args.address or os.environ.get("RAY_ADDRESS"):
            parser.error("--direct-ingress starts a new local Ray; on a cluster, put serve.run.direct_ingress_env's "
                         "variables in the environment of `ray start` on every node")
        if len(config.get("applications", [])) != 1:
            parser.error("--direct-ingress deploys one application (its Ingress serves the port)")
    quiet: dict[str, str] = {}
    if args.quiet_ray:
        if args.address or os.environ.get("RAY_ADDRESS"):
            parser.error("--quiet-ray starts a new local Ray; on a cluster, put cluster.local.QUIET_RAY_ENV's "
                         "variables in the environment of `ray start`")
        from cluster.local import quiet_ray_env  # imports Ray: the module's comparisons stay Ray-free

        quiet = quiet_ray_env()
    with direct_ingress(port) if args.direct_ingress else contextlib.nullcontext(), scoped.environ(quiet):
        return _run(args, config, port)


def _run(args: argparse.Namespace, config: dict[str, Any], port: int) -> int:
    schema = deploy(config, args.address)
    names = [app.name for app in schema.applications]
    print(f"serve.run: submitted {args.config} (applications: {', '.join(names)})", flush=True)
    reason = wait_running(names, schedule_timeout_s=args.schedule_timeout_s, ready_timeout_s=args.ready_timeout_s)
    if reason:
        print(f"serve.run: FAILED: {reason}", file=sys.stderr, flush=True)
        return 1
    host = schema.http_options.host
    for app in schema.applications:
        print(f"serve.run: '{app.name}' is RUNNING at http://{host}:{port}{app.route_prefix or ''}", flush=True)
    if args.direct_ingress:
        print(f"serve.run: direct ingress: the Ingress replica serves port {port}; Serve's proxy is on "
              f"{schema.http_options.port}", flush=True)
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
