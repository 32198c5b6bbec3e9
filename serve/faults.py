"""Killing parts of a running LongRAG Serve app from outside, as a crash would (``python -m jobs.chaos``,
``tests/serve/test_app.py``). A driver connected to the app's Ray finds Serve's replica actors by name,
``SERVE_REPLICA::{app}#{deployment}#{id}`` in Serve's namespace (the shard replicas too: application
``index-{build_id}``, deployment ``shard-{id}``). ``ray.kill(..., no_restart=True)`` ends an actor
for good: Ray does not restart it; Serve replaces the replica.
"""

from __future__ import annotations

import time

import ray


def serve_replicas(app: str, deployment: str) -> list[tuple[str, str]]:
    """``(name, namespace)`` of the replica actors of one deployment of the app."""
    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    return [(a["name"], a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(prefix)]


def kill(*actors: tuple[str, str], wait_s: float = 30.0) -> list[str]:
    """Kill the named actors ``(name, namespace)`` for good, all at once, and wait until their names
    are free (the actors are dead)."""
    for name, namespace in actors:
        ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
    deadline = time.monotonic() + wait_s
    left = list(actors)
    while left:
        for name, namespace in list(left):
            try:
                ray.get_actor(name, namespace=namespace)
            except ValueError:
                left.remove((name, namespace))
        if left and time.monotonic() > deadline:
            raise TimeoutError(f"{left} still alive {wait_s:g} s after ray.kill")
        time.sleep(0.05)
    return [name for name, _ in actors]


def kill_index_replicas(build_id: str, shard: int, count: int) -> list[str]:
    """Kill ``count`` replicas of one shard deployment of a build's Serve application
    (:mod:`serve.index_app`) for good; their names. Serve starts new ones."""
    from serve.index_app import index_app_name, shard_deployment_name

    replicas = serve_replicas(index_app_name(build_id), shard_deployment_name(shard))
    if len(replicas) < count:
        raise ValueError(f"build {build_id!r} shard {shard} has {len(replicas)} replica(s), asked to kill {count}")
    return kill(*replicas[:count])


def kill_serve_replica(app: str, deployment: str) -> str:
    """Kill one replica actor of a deployment (Serve starts a new one); its name."""
    replicas = serve_replicas(app, deployment)
    if not replicas:
        raise ValueError(f"app {app!r} has no running replica of deployment {deployment!r}")
    return kill(replicas[0])[0]
