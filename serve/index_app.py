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

Who holds an index application is kept in one place, :class:`IndexHolders`: a detached, named Ray
actor (one per cluster) with the set of holders of each application. Every reader of a build holds
its application while it uses it (each Retriever replica's backend, each :func:`open_index` job,
whichever Serve app it belongs to) and releases it when done; the release that leaves the set empty
deletes the application, inside the registry's call, so a holder arriving at that moment either
comes first (and the application stays) or comes after the deletion was submitted (and
:func:`ensure_index_app` deploys it again). No side counts another's replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ray import serve

from actors.index_shard import IndexShardReplica
from actors.sharded_index import IndexNotReady, ShardedIndex
from cluster import ray_private
from longrag.index.artifacts import ArtifactStore
from longrag.index.placement import ShardPlacement, describe_ask, shard_actor_resources

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


def index_app(build_uri: str, manifest: Manifest, config: IndexConfig, *, verify: bool = True,
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


def ensure_index_app(build_uri: str, manifest: Manifest, config: IndexConfig, *,
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


HOLDERS_NAME = "longrag-index-holders"
HOLDERS_NAMESPACE = "longrag"


class IndexHolders:
    """The holders of each index application, and the deletion of an application nobody holds.

    Run as one detached actor per cluster (:func:`holders_call`: named ``longrag-index-holders`` in the
    namespace ``longrag``, 0 CPUs, on the head node, restarted if it dies); its calls run one at a
    time, so a hold and a release of the same application never interleave.

    * ``hold(app, holder, actor_id)``: ``holder`` (unique per use: a Retriever backend instance, a job's
      :func:`open_index`) reads the build through ``app``; ``actor_id``: the holder's actor, if it is one.
    * ``release(app, holder)``: it stopped; the last holder's release deletes the application (Serve
      drains its replicas) and returns True.

    A holder that dies without releasing (its node lost) is dropped at the registry's next call
    (``hold``, ``release`` or ``held``, of any application) once the GCS reports its actor dead, and an
    application it held alone is deleted then; a job (no actor) that dies without its ``finally``
    leaves its hold until an operator deletes the application. When the registry itself
    restarts it has lost its table: the index applications running then are never deleted by it
    (logged; deleting one the registry no longer knows the holders of could take shards from a
    live service), those deployed after are handled as usual."""

    def __init__(self) -> None:
        self.holders: dict[str, dict[str, str | None]] = {}  # app -> {holder: its actor id, or None}
        self.unknown: set[str] = set()  # the applications of before a restart: their holders are not known
        import ray

        if ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed:
            from serve.status import serve_status

            self.unknown = {a for a in serve_status().applications if a.startswith("index-")}
            log.warning("the index holder registry restarted: it will not delete %s (holders unknown; delete "
                        "them with `serve delete` once unused)", sorted(self.unknown) or "no application")

    def hold(self, app: str, holder: str, actor_id: str | None = None) -> int:
        """Register ``holder`` of ``app``; returns how many hold it now."""
        self._prune(keep=app)  # app itself is not deleted here: it is about to be held
        self.holders.setdefault(app, {})[holder] = actor_id
        return len(self.holders[app])

    def release(self, app: str, holder: str) -> bool:
        """``holder`` stopped reading ``app``; deletes ``app`` when nobody else holds it (True then)."""
        held = self.holders.get(app)
        if held is None or held.pop(holder, False) is False:
            self._prune()
            return False  # released before (or never held here)
        return app in self._prune(released_by={app: holder})

    def held(self) -> dict[str, list[str]]:
        """``{application: its holders}`` (the holders of dead actors dropped first)."""
        self._prune()
        return {app: sorted(h) for app, h in self.holders.items()}

    def _prune(self, keep: str | None = None, released_by: dict[str, str] | None = None) -> list[str]:
        """Drop the holders whose actor the GCS reports dead, of every application, then delete each
        application (but ``keep``) that nobody holds; returns the applications deleted.
        ``released_by``: the holder whose release emptied an application, for the log."""
        if any(a for held in self.holders.values() for a in held.values()):
            try:
                dead = {row["ActorID"] for row in ray_private.actor_table() if row.get("State") == "DEAD"}
            except Exception:  # the GCS did not answer: keep every hold until a later call
                log.warning("could not read the actor table; keeping the holders of dead actors for now",
                            exc_info=True)
                dead = set()
            for app, held in self.holders.items():
                for holder, actor in list(held.items()):
                    if actor and actor in dead:
                        log.warning("%s: dropping holder %s, its actor %s died without releasing it",
                                    app, holder, actor)
                        del held[holder]
        deleted = []
        for app, held in list(self.holders.items()):
            if held or app == keep:
                continue
            del self.holders[app]
            if app in self.unknown:
                log.warning("not deleting %s: its holders from before the registry restarted are unknown", app)
                continue
            why = (f"its last holder ({released_by[app]}) released it" if released_by and app in released_by
                   else "the holders left died without releasing it")
            log.info("deleting the index application %s: %s", app, why)
            ray_private.serve_delete_nowait(app)
            deleted.append(app)
        return deleted


_holders_actor: Any = None


def holders_call(method: str, *args: Any) -> Any:
    """``IndexHolders.<method>(*args)`` on the cluster's registry (created by the first caller)."""
    import ray

    global _holders_actor
    if _holders_actor is None:
        _holders_actor = ray.remote(IndexHolders)
    handle = _holders_actor.options(
        name=HOLDERS_NAME, namespace=HOLDERS_NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
        resources={"node:__internal_head__": 0.001}, max_restarts=-1, max_task_retries=-1).remote()
    return ray.get(getattr(handle, method).remote(*args), timeout=60)


def _new_holder(who: str) -> tuple[str, str | None]:
    """A holder name unique to this use, and this process's actor id (None in a driver)."""
    import ray

    actor = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
    return f"{who or 'anonymous'}#{uuid.uuid4().hex[:8]}", actor


class ServeShards(ShardedIndex):
    """:class:`ShardedIndex` over one deployment handle per shard of the application ``app``: a
    failed or timed-out call is tried once more on the same deployment (Serve routes it to another
    replica), one refused by a full replica again after a short backoff within the call's deadline,
    and the replica counts are Serve's (``RUNNING`` of those not stopping)."""

    def __init__(self, app: str, manifest: Manifest, config: IndexConfig) -> None:
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
def open_index(build_uri: str, config: IndexConfig, *, ready_timeout_s: float = 600.0) -> Iterator[ServeShards]:
    """The build's shards for a job that searches without the HTTP app (evaluation, benchmarks): its
    Serve application (the same one the Retriever uses; started with Serve's proxies off when Serve
    is not running yet), held by this job while it runs (:class:`IndexHolders`): on exit it is
    deleted unless someone else holds it (a live service's Retrievers, another job)."""
    from serve.status import serve_status

    manifest = ArtifactStore.open(build_uri).read_manifest()
    name = index_app_name(manifest.build_id)
    before = serve_status()
    started = not before.applications and not before.proxies  # Serve not running on this cluster
    if started:
        serve.start(proxy_location="Disabled")
    holder, actor = _new_holder("job")
    holders_call("hold", name, holder, actor)
    try:
        ensure_index_app(build_uri, manifest, config, ready_timeout_s=ready_timeout_s)
        yield ServeShards(name, manifest, config)
    finally:
        if holders_call("release", name, holder):  # nobody else holds it: the registry submitted its deletion;
            serve.delete(name)  # this one waits until it is gone (a later job, or Serve's shutdown, finds it gone)
        if started and not serve_status().applications:  # leave no proxy-less Serve behind for a later app
            serve.shutdown()


class ServeIndex(ServeShards):
    """The Retriever's index backend: :class:`ServeShards` over the build's application, deployed
    when it does not run yet, and held (:class:`IndexHolders`) from construction until ``release``
    (this Retriever replica goes away) or ``retire`` (a newer build took over; the hold ends
    ``index.retire_after_s`` later): the application goes with its last holder, whichever Serve app
    or job that is. Each instance is its own holder, so a build adopted again (the alias rolled back
    within ``retire_after_s``) is held by the new instance while the old one's retirement ends."""

    def __init__(self, index_uri: str, config: IndexConfig, *, app_name: str = "", holder: str = "",
                 ready_timeout_s: float = 300.0) -> None:
        manifest = ArtifactStore.open(index_uri).read_manifest()
        self.config, self.user_app = config, app_name
        name = index_app_name(manifest.build_id)
        self.holder, actor = _new_holder(f"{app_name}/{holder}" if app_name else holder)
        # held before it is ensured: a last release racing this one either sees this hold, or has
        # submitted the deletion by the time ensure_index_app looks (and deploys it again)
        holders_call("hold", name, self.holder, actor)
        try:
            super().__init__(ensure_index_app(index_uri, manifest, config, ready_timeout_s=ready_timeout_s),
                             manifest, config)
        except BaseException:
            holders_call("release", name, self.holder)
            raise
        self._retiring: asyncio.Task | None = None
        self._released = False

    async def retire(self) -> None:
        """A newer build took over: end this hold after ``index.retire_after_s``, by when this
        replica's requests still on this build have ended (Serve drains the replicas it deletes);
        the application is deleted then if nobody else holds it (another Retriever replica not yet
        switched, the same build adopted again after a rollback, a job)."""
        async def later() -> None:
            await asyncio.sleep(self.config.retire_after_s)
            await self._release("a superseded build")

        if self._retiring is None or self._retiring.done():
            self._retiring = asyncio.get_running_loop().create_task(later())

    @property
    def released(self) -> bool:
        """Whether this instance's hold ended (its retirement's delay passed, or :meth:`release`)."""
        return self._released

    async def release(self) -> None:
        """This Retriever replica goes away (scale-down, redeploy, delete): end its hold now (a
        retirement still waiting is cancelled: its hold ends here instead)."""
        if self._retiring is not None and not self._retiring.done():
            self._retiring.cancel()
        await self._release("its Retriever replica going away")

    async def _release(self, why: str) -> None:
        if self._released:
            return
        self._released = True
        try:
            if await asyncio.to_thread(holders_call, "release", self.app, self.holder):
                log.info("deleted the index application %s with its last holder (%s)", self.app, why)
        except Exception:  # Ray shutting down: the application goes with it
            log.warning("could not release %s for %s", self.app, self.holder, exc_info=True)
