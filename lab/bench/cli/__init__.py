"""The benchmarks, one module each, that ``longrag bench <name>`` (``python -m jobs.bench <name>``) runs:
each one's options and ``main(argv)``, its measuring logic beside it or in ``lab.bench``. The ones that
need a cluster import Ray inside the function that starts it, so importing any of them needs no Ray."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx


@contextlib.contextmanager
def running_app(config: dict[str, Any], apps: list[str], port: int, *, num_cpus: float = 2,
                direct_ingress: int | None = None, extra_apps: list[dict[str, Any]] | None = None,
                say: Callable[[str], None] = print) -> Iterator[None]:
    """A local Ray (``num_cpus``) with the Serve ``config`` deployed and healthy on ``port``, for the
    ``with`` block; then Serve and Ray are shut down, whatever happened. ``direct_ingress``: that many
    apps' Ingress replicas serve their ports themselves (``serve.run.direct_ingress``); ``extra_apps``
    are deployed after the first ones are running (the serving benchmark's floor). The benchmarks that
    start the app (``serve``, ``traffic``) share it. Ray is imported here, inside the function."""
    from ray import serve

    from cluster.local import start_or_join
    from serve.run import deploy, wait_healthy, wait_running
    from serve.run import direct_ingress as direct

    with direct(port, direct_ingress) if direct_ingress else contextlib.nullcontext():
        handle = start_or_join(None, num_cpus=num_cpus)
        try:
            deploy(config)
            reason = wait_running(apps, schedule_timeout_s=180, ready_timeout_s=600)  # a loaded machine starts slowly
            if extra_apps and not reason:
                config["applications"].extend(extra_apps)
                deploy(config)
                reason = wait_running([*apps, *(a["name"] for a in extra_apps)], schedule_timeout_s=180,
                                      ready_timeout_s=600)
            if reason:
                raise RuntimeError(f"the app did not start: {reason}")
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
                wait_healthy(c)
            say(f"app RUNNING on 127.0.0.1:{port}")
            yield
        finally:
            try:
                serve.shutdown()
            finally:
                handle.shutdown()
