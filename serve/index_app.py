"""The shard tier on Ray Serve (``index.backend=serve``): one Serve application per build.

Each shard of a build is a deployment (``shard-<id>``) of the application ``index-<build_id>``;
its replicas are :class:`actors.index_shard.IndexShardReplica` (the same shard code as the actor
tier and the in-process index: loads its shard from the store, verifies it, searches in a worker
thread while its event loop answers Serve's health checks). Serve does what the actor tier did by
hand: restarts a dead replica, routes around it, bounds each replica's queue
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
to another replica).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ray import serve

from actors.index_shard import IndexShardReplica
from actors.sharded_index import IndexNotReady, ShardedIndex
from longrag.index.artifacts import ArtifactStore
from longrag.index.placement import ShardPlacement, shard_actor_resources
from longrag.types import ShardRedundancy

if TYPE_CHECKING:
    from longrag.config import IndexConfig
    from longrag.index.manifest import Manifest

log = logging.getLogger(__name__)

#: Replica states that count towards a shard's replicas (all but those going away).
_GOING = ("STOPPING",)


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


def index_app(build_uri: str, manifest: "Manifest", config: "IndexConfig", *, verify: bool = True) -> Any:
    """The Serve application of one build: a deployment per shard, bound to :class:`IndexBuild`."""
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
        }
        if config.autoscaling:
            options["autoscaling_config"] = dict(config.autoscaling)
            options["num_replicas"] = "auto"
        else:
            options["num_replicas"] = config.replicas
        shards.append(serve.deployment(IndexShardReplica).options(**options).bind(
            build_uri, entry.shard_id, verify, config.shard_threads, config.search_params, config.device))
    return IndexBuild.bind(manifest.build_id, len(shards), *shards)


def ensure_index_app(build_uri: str, manifest: "Manifest", config: "IndexConfig", *,
                     ready_timeout_s: float = 300.0) -> str:
    """Deploy the build's application unless it runs already, and wait until it is RUNNING; returns
    its name. Raises :class:`IndexNotReady` with Serve's reason (a replica that cannot be placed:
    what it asks and what the cluster lacks) when it does not come up."""
    from serve.run import serve_status, wait_running

    name = index_app_name(manifest.build_id)
    status = serve_status().applications.get(name)
    if status is None or str(getattr(status.status, "value", status.status)) in ("DEPLOY_FAILED", "DELETING"):
        log.info("deploying the index application %s (%d shards) for %s", name, len(manifest.shards), build_uri)
        serve.run(index_app(build_uri, manifest, config), name=name, route_prefix=None, blocking=False)
    reason = wait_running([name], schedule_timeout_s=min(60.0, ready_timeout_s), ready_timeout_s=ready_timeout_s,
                          log=log.info)
    if reason:
        raise IndexNotReady(f"the index application {name} of {build_uri} did not start: {reason}")
    return name


class ServeShards(ShardedIndex):
    """:class:`ShardedIndex` over one deployment handle per shard: a failed or timed-out call is
    tried once more on the same deployment (Serve routes it to another replica), and the replica
    counts are Serve's (``RUNNING`` of those not stopping), not guessed from failed calls."""

    def __init__(self, app: str, manifest: "Manifest", config: "IndexConfig") -> None:
        self.app = app
        handles = [serve.get_deployment_handle(shard_deployment_name(s.shard_id), app_name=app)
                   for s in manifest.shards]
        super().__init__([[h, h] for h in handles], timeout_s=config.search_timeout_s, manifest=manifest)
        self.counts: list[tuple[int, int]] = [(config.replicas, config.replicas)] * len(handles)

        self._recount: asyncio.Task | None = None

    def redundancy(self) -> list[ShardRedundancy]:
        return [ShardRedundancy(shard=s, live=live, replicas=n) for s, (live, n) in enumerate(self.counts)]

    async def search(self, queries: Any, k: int, texts: list[str] | None = None, fusion: Any = None) -> Any:
        """As :meth:`ShardedIndex.search`; a call that failed over has Serve's replica counts read
        again (in the background), so the next responses show a lost replica as soon as Serve does."""
        res = await super().search(queries, k, texts, fusion)
        if res.coverage.failovers and (self._recount is None or self._recount.done()):
            self._recount = asyncio.get_running_loop().create_task(self.liveness())
        return res

    async def liveness(self, timeout_s: float = 5.0) -> list[list[bool]]:
        from serve.run import serve_status

        status = await asyncio.to_thread(serve_status)
        app = status.applications.get(self.app)
        counts = []
        for s in range(self.n_shards):
            dep = app.deployments.get(shard_deployment_name(s)) if app else None
            states = {str(getattr(k, "value", k)): n for k, n in (dep.replica_states.items() if dep else [])}
            running = states.get("RUNNING", 0)
            counts.append((running, max(running, sum(n for k, n in states.items() if k not in _GOING))))
        self.counts = counts
        return [[True] * live + [False] * (n - live) for live, n in counts]

    def kill(self) -> None:
        serve.delete(self.app, _blocking=False)


class ServeIndex:
    """The Retriever's index backend over the build's Serve application (``index.backend=serve``):
    the search API of :class:`actors.sharded_index.ShardedIndex` and the backend's lifecycle
    (``renew``/``repair`` are Serve's own work here; ``retire`` deletes a superseded build's
    application once no Retriever replica can still be on it; ``release``, as a Retriever replica
    goes away, deletes it only with the last replica of the Retriever deployment)."""

    def __init__(self, index_uri: str, config: "IndexConfig", *, app_name: str = "", holder: str = "",
                 ready_timeout_s: float = 300.0) -> None:
        self.manifest = ArtifactStore.open(index_uri).read_manifest()
        self.config, self.user_app, self.holder = config, app_name, holder
        self.app = ensure_index_app(index_uri, self.manifest, config, ready_timeout_s=ready_timeout_s)
        self.index = ServeShards(self.app, self.manifest, config)
        self._retiring: asyncio.Task | None = None

    async def search(self, queries: Any, k: int, texts: list[str] | None = None, fusion: Any = None) -> Any:
        return await self.index.search(queries, k, texts, fusion)

    async def retrieve_units(self, hits: list[Any], query: Any = None) -> list[Any]:
        return await self.index.retrieve_units(hits, query)

    async def liveness(self) -> list[list[bool]]:
        return await self.index.liveness()

    async def renew(self) -> None:
        """Nothing is leased: the application lives until it is retired or released."""

    async def repair(self) -> list[tuple[int, int]]:
        return []  # Serve replaces dead replicas itself

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
        from serve.run import serve_status

        try:
            app = (await asyncio.to_thread(serve_status)).applications.get(self.user_app)
            dep = app.deployments.get("Retriever") if app else None
            alive = sum(n for k, n in (dep.replica_states.items() if dep else [])
                        if str(getattr(k, "value", k)) in ("RUNNING", "STARTING", "UPDATING", "RECOVERING"))
        except Exception as exc:  # Serve shutting down: nothing left to keep the application for
            log.debug("serve status on release: %r", exc)
            alive = 0
        if alive <= 1:  # this replica, or none: nobody else reads the build through this application
            log.info("deleting the index application %s with the last Retriever replica", self.app)
            await asyncio.to_thread(serve.delete, self.app, False)
