"""The shard tier on Ray Serve: one Serve application per build.

Each shard of a build is a deployment (``shard-<id>``) of the application ``index-<build_id>``;
its replicas are :class:`actors.index_shard.IndexShardReplica` (the same shard code as the
in-process index: loads its shard from the store, verifies it, searches in a worker thread while
its event loop answers Serve's health checks). Serve restarts a dead replica, routes around it,
bounds each replica's queue
(``max_ongoing_requests`` = ``index.shard_max_pending``), places replicas with the capacity
plan's asks (``ray_actor_options``: CPUs, memory, the index nodes' resource, a GPU) and at most
``index.max_replicas_per_node`` per node, scales them (``index.autoscaling``: Serve's
``autoscaling_config``; else ``index.replicas``), and drains them when the application is deleted.

The application is deployed imperatively (``serve.run``) by the first Retriever replica that
serves the build (:func:`ensure_index_app`; later ones find it RUNNING; two replicas starting at
the same moment may both deploy it, and the second deploy rolls the shard replicas over once while
the first ones keep answering: Serve versions imperative deploys itself). Serve deletes on a config
push (``serve deploy``, KubeRay's ``serveConfigV2``) only the applications that push declared, so
an index application outlives the pushes of the app that uses it. The Retriever keeps what is the
product's own (:class:`ServeIndex` over :class:`actors.sharded_index.ShardedIndex`): scatter/gather,
the exact merge, coverage and ``degraded``, a second try within the stage deadline (Serve routes it
to another replica). Jobs that search without the HTTP app (evaluation, benchmarks) use the same
application through :func:`open_index`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Iterator

from ray import serve

from actors.index_shard import IndexShardReplica
from actors.sharded_index import IndexNotReady, ShardedIndex
from cluster import ray_private
from longrag.index.artifacts import ArtifactStore
from longrag.index.placement import ShardPlacement, describe_ask, shard_actor_resources
from longrag.types import ShardRedundancy

if TYPE_CHECKING:
    from longrag.config import IndexConfig
    from longrag.index.manifest import Manifest

log = logging.getLogger(__name__)

#: Replica states that count towards a shard's replicas (all but those going away).
_GOING = ("STOPPING",)
#: Starts of a shard replica that fails to load before its application fails (Serve's default: 20).
CONSTRUCTOR_RETRIES = 3


def index_app_name(build_id: str) -> str:
    return f"index-{build_id}"


def shard_deployment_name(shard_id: int) -> str:
    return f"shard-{shard_id}"


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64)
class IndexBuild:
    """The index application's ingress: it holds the shard deployments (so they are one application,
    deployed and deleted together) and says which build it serves."""

    def __init__(self, build_id: str, n_shards: int, *shards: Any) -> None:
        self.build_id, self.n_shards = build_id, n_shards

    def describe(self) -> dict[str, Any]:
        return {"build_id": self.build_id, "shards": self.n_shards}


def index_app(build_uri: str, manifest: "Manifest", config: "IndexConfig", *, verify: bool = True,
              shard_cls: type = IndexShardReplica) -> Any:
    """The Serve application of one build: a deployment of ``shard_cls`` per shard, bound to
    :class:`IndexBuild`. A replica that fails to load its shard (a checksum mismatch, a GPU missing)
    is tried ``CONSTRUCTOR_RETRIES`` times, then the application fails with its error."""
    placement = ShardPlacement.of(config)
    shards = []
    for entry in manifest.shards:
        ask = shard_actor_resources(placement, entry)
        options: dict[str, Any] = {
            "name": shard_deployment_name(entry.shard_id),
            "ray_actor_options": {k: ask[k] for k in ("num_cpus", "num_gpus", "memory", "resources") if k in ask},
            "max_ongoing_requests": config.shard_max_pending,
            "max_replicas_per_node": config.max_replicas_per_node,
            "health_check_period_s": 5.0, "health_check_timeout_s": 30.0,
            "max_constructor_retry_count": CONSTRUCTOR_RETRIES,
        }
        if config.autoscaling:
            options["autoscaling_config"] = dict(config.autoscaling)
            options["num_replicas"] = "auto"
        else:
            options["num_replicas"] = config.replicas
        shards.append(serve.deployment(shard_cls).options(**options).bind(
            build_uri, entry.shard_id, verify, config.shard_threads, config.search_params, config.device,
            max_pending=config.shard_max_pending, cache=config.shard_cache, cache_dir=config.shard_cache_dir))
    return IndexBuild.bind(manifest.build_id, len(shards), *shards)


def ensure_index_app(build_uri: str, manifest: "Manifest", config: "IndexConfig", *,
                     ready_timeout_s: float = 300.0) -> str:
    """Deploy the build's application unless it runs already, and wait until it serves (RUNNING, or
    UNHEALTHY while Serve replaces a lost replica and every shard still has a running one); returns
    its name. Raises :class:`IndexNotReady` with Serve's reason (a replica that cannot be placed:
    what it asks and what the cluster lacks; a replica that fails to load) when it does not come up."""
    from serve.status import running_replicas, serve_status, wait_running

    name = index_app_name(manifest.build_id)
    status = serve_status().applications.get(name)
    if status is None or _state(status) in ("DEPLOY_FAILED", "DELETING"):
        log.info("deploying the index application %s (%d shards) for %s", name, len(manifest.shards), build_uri)
        ray_private.serve_run_nowait(index_app(build_uri, manifest, config), name=name, route_prefix=None)
    deadline = time.monotonic() + ready_timeout_s
    while True:
        left = max(1.0, deadline - time.monotonic())
        reason = wait_running([name], schedule_timeout_s=min(60.0, left / 2), ready_timeout_s=left, log=log.info)
        running = running_replicas(name)  # {deployment: RUNNING replicas}
        if reason is None or all(running.get(shard_deployment_name(s.shard_id)) for s in manifest.shards):
            return name
        status = serve_status().applications.get(name)
        if status is None or _state(status) != "UNHEALTHY" or time.monotonic() >= deadline:
            break
        time.sleep(1.0)  # a shard with no running replica while Serve replaces it: wait for one
    placement = ShardPlacement.of(config)
    ask = max((describe_ask(shard_actor_resources(placement, s)) for s in manifest.shards),
              key=lambda a: a.get("memory_gib", 0.0))
    raise IndexNotReady(
        f"the index application {name} of {build_uri} did not start: {reason}\nIts largest shard's replica "
        f"asks for {ask}: lower index.shard_num_cpus or index.replicas, give Ray more CPUs, add nodes that "
        "offer index.node_resource (and a GPU for index.device=cuda), or lower index.shard_memory_factor.")


def _state(status: Any) -> str:
    return str(getattr(status.status, "value", status.status))


class ServeShards(ShardedIndex):
    """:class:`ShardedIndex` over one deployment handle per shard of the application ``app``: a
    failed or timed-out call is tried once more on the same deployment (Serve routes it to another
    replica), and the replica counts are Serve's (``RUNNING`` of those not stopping)."""

    def __init__(self, app: str, manifest: "Manifest", config: "IndexConfig") -> None:
        self.app = app
        handles = [serve.get_deployment_handle(shard_deployment_name(s.shard_id), app_name=app)
                   for s in manifest.shards]
        super().__init__(handles, timeout_s=config.search_timeout_s, manifest=manifest, replicas=config.replicas,
                         fused_fetch_max_units=config.fused_fetch_max_units)

    async def replica_counts(self) -> list[tuple[int, int]]:
        from serve.status import serve_status

        status = await asyncio.to_thread(serve_status)
        app = status.applications.get(self.app)
        counts = []
        for s in range(self.n_shards):
            dep = app.deployments.get(shard_deployment_name(s)) if app else None
            states = {str(getattr(k, "value", k)): n for k, n in (dep.replica_states.items() if dep else [])}
            running = states.get("RUNNING", 0)
            counts.append((running, max(running, sum(n for k, n in states.items() if k not in _GOING))))
        return counts


@contextlib.contextmanager
def open_index(build_uri: str, config: "IndexConfig", *, ready_timeout_s: float = 600.0) -> Iterator[ServeShards]:
    """The build's shards for a job that searches without the HTTP app (evaluation, benchmarks): its
    Serve application (the same one the Retriever uses; started with Serve's proxies off when Serve
    is not running yet), deleted on exit unless it was running before (a live service's)."""
    from serve.status import serve_status

    manifest = ArtifactStore.open(build_uri).read_manifest()
    name = index_app_name(manifest.build_id)
    before = serve_status()
    started = not before.applications and not before.proxies  # Serve not running on this cluster
    if started:
        serve.start(proxy_location="Disabled")
    try:
        ensure_index_app(build_uri, manifest, config, ready_timeout_s=ready_timeout_s)
        yield ServeShards(name, manifest, config)
    finally:
        if name not in before.applications:
            serve.delete(name)
        if started and not serve_status().applications:  # leave no proxy-less Serve behind for a later app
            serve.shutdown()


class ServeIndex(ServeShards):
    """The Retriever's index backend: :class:`ServeShards` over the build's application, deployed
    when it does not run yet, and its lifecycle: ``retire`` deletes a superseded build's application
    once no Retriever replica can still be on it; ``release``, as a Retriever replica goes away,
    deletes it only with the last replica of the Retriever deployment."""

    def __init__(self, index_uri: str, config: "IndexConfig", *, app_name: str = "", holder: str = "",
                 ready_timeout_s: float = 300.0) -> None:
        manifest = ArtifactStore.open(index_uri).read_manifest()
        self.config, self.user_app, self.holder = config, app_name, holder
        super().__init__(ensure_index_app(index_uri, manifest, config, ready_timeout_s=ready_timeout_s), manifest,
                         config)
        self._retiring: asyncio.Task | None = None

    async def retire(self) -> None:
        """A newer build took over: delete this application after ``index.retire_after_s``, by when
        every Retriever replica has followed the alias (each re-reads it every ``index.refresh_s``)
        and the requests still on this build have ended (Serve drains the replicas it deletes)."""
        async def later() -> None:
            await asyncio.sleep(self.config.retire_after_s)
            log.info("deleting the index application %s of a superseded build", self.app)
            await asyncio.to_thread(serve.delete, self.app, False)

        self._retiring = asyncio.get_running_loop().create_task(later())

    async def release(self) -> None:
        """This Retriever replica goes away (scale-down, redeploy, delete): the application goes with
        the deployment's last replica, and stays while another replica of it is alive."""
        from serve.status import serve_status

        try:
            app = (await asyncio.to_thread(serve_status)).applications.get(self.user_app)
            dep = app.deployments.get("Retriever") if app and _state(app) != "DELETING" else None
            # this replica is STOPPING by now: the others that serve or will (a scale-down or a
            # redeploy leaves some; the app's deletion, none)
            alive = sum(n for k, n in (dep.replica_states.items() if dep else [])
                        if str(getattr(k, "value", k)) in ("RUNNING", "STARTING", "UPDATING", "RECOVERING"))
        except Exception as exc:  # Serve shutting down: nothing left to keep the application for
            log.debug("serve status on release: %r", exc)
            alive = 0
        if alive == 0:  # nobody else reads the build through this application
            log.info("deleting the index application %s with the last Retriever replica", self.app)
            await asyncio.to_thread(serve.delete, self.app, False)
