"""One index tier per build, shared by every Retriever replica of a Serve app.

The shard actors of a build are named ``{build_id}-{settings}-s{shard}-r{replica}`` in the
namespace ``longrag-index-{app}`` and detached, so every Retriever replica finds the same actors
(``get_if_exists``) instead of loading its own copy: 2 Retriever replicas x ``index.replicas=2``
is 2 actors per shard, as the capacity plan assumes. ``{settings}`` is a digest of the store URI
and the shard actors' settings (replicas, CPUs, threads, search parameters), so an app that
serves the same build with other settings gets its own tier.

Lifetime: detached actors outlive their creator, so an ``IndexTierLease`` (one small detached
actor per tier, no CPU) owns it. Every Retriever replica holds a lease: ``acquire`` on start (the
lease creates or finds the shard actors, one call at a time, so no replica can race a teardown),
``renew`` on every Serve health check, ``release`` in its ``__del__`` (Serve calls it on scale-down,
redeploy, ``serve delete`` and ``serve shutdown``). When the last holder releases, the lease kills
the shard actors; a holder that died without releasing (a crashed replica, a lost node) stops
renewing and is dropped after ``ttl_s``, and a lease with no holders for ``ttl_s`` retires the
tier and exits. A lost lease actor is restarted by Ray and repopulated by the next renewals.

Repair: a shard actor restarts by itself after a crash (``max_restarts``), but one that is gone for
good (killed with ``no_restart``, or crashed once more than ``max_restarts``) frees its name. Every
Retriever health check looks for such names (:meth:`TieredIndex.repair`) and, when it finds one,
asks the lease again: the lease re-creates the missing actors (``get_if_exists`` keeps the others)
and the holder swaps in the new handles. Until a re-created replica has loaded its shard, health
and every response's coverage say "1 of 2 replicas".
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import ray

from actors.sharded_index import ShardedIndex, actor_ask, launch_settings, placement_of, shard_actor_name
from longrag.index.lexical import require_lexical

if TYPE_CHECKING:
    from longrag.config import IndexConfig

log = logging.getLogger(__name__)

LEASE_TTL_S = 60.0


def tier_identity(app_name: str, build_id: str, store_uri: str, launch: dict[str, Any]) -> tuple[str, str]:
    """``(namespace, name prefix)`` of the shard actors of one build in one Serve app."""
    digest = hashlib.sha256(json.dumps({"uri": store_uri, **launch}, sort_keys=True).encode()).hexdigest()[:10]
    return f"longrag-index-{app_name}", f"{build_id}-{digest}"


@ray.remote(num_cpus=0, max_restarts=-1)
class IndexTierLease:
    def __init__(self, namespace: str, prefix: str, store_uri: str, launch: dict[str, Any],
                 ttl_s: float = LEASE_TTL_S) -> None:
        self.namespace, self.prefix, self.store_uri, self.launch = namespace, prefix, store_uri, launch
        self.ttl_s = ttl_s
        self.holders: dict[str, float] = {}  # holder id -> monotonic time of its last renewal
        self.started = self.last_held = time.monotonic()
        # A restarted lease has lost its holders until they renew: it must not retire the tier at once.
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.live = False  # whether the shard actors exist (launched and not retired)
        self._lock: asyncio.Lock | None = None
        self._reaper: asyncio.Task | None = None

    def _guard(self) -> asyncio.Lock:
        if self._lock is None:  # created on the actor's event loop
            self._lock = asyncio.Lock()
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        return self._lock

    async def acquire(self, holder: str) -> list[list[Any]]:
        """Register ``holder`` and return the tier's ``[shard][replica]`` actor handles (created if missing)."""
        async with self._guard():
            self.holders[holder] = self.last_held = time.monotonic()
            index = await asyncio.to_thread(
                ShardedIndex.launch, self.store_uri, name_prefix=self.prefix, namespace=self.namespace,
                detached=True, **self.launch,
            )
            self.live = True
            return index.replicas

    async def renew(self, holder: str) -> int:
        async with self._guard():
            self.holders[holder] = self.last_held = time.monotonic()
            return len(self.holders)

    async def release(self, holder: str) -> int:
        """Drop ``holder``; the last holder out retires the tier. Returns the holders left."""
        async with self._guard():
            self.holders.pop(holder, None)
            self._prune()
            # Just after a restart of this lease, holders have not renewed yet: leave it to the reaper.
            settled = not self.restarted or time.monotonic() - self.started >= self.ttl_s
            if not self.holders and self.live and settled:
                await self._retire()
            return len(self.holders)

    def _prune(self) -> None:
        now = time.monotonic()
        for holder, seen in list(self.holders.items()):
            if now - seen > self.ttl_s:
                log.warning("index tier %s: holder %s stopped renewing; dropped", self.prefix, holder)
                del self.holders[holder]
        if self.holders:
            self.last_held = now

    async def _retire(self) -> None:
        """Kill the shard actors and wait until their names are free (a new tier may reuse them)."""
        names = await asyncio.to_thread(self._actor_names)

        def kill_and_wait() -> None:
            for name in names:
                try:
                    ray.kill(ray.get_actor(name, namespace=self.namespace), no_restart=True)
                except ValueError:  # never started, or already gone
                    pass
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                left = []
                for name in names:
                    try:
                        ray.get_actor(name, namespace=self.namespace)
                        left.append(name)
                    except ValueError:
                        pass
                if not left:
                    return
                time.sleep(0.2)

        await asyncio.to_thread(kill_and_wait)
        self.live = False
        log.info("index tier %s retired (%d actors)", self.prefix, len(names))

    def _actor_names(self) -> list[str]:
        from longrag.index.artifacts import ArtifactStore

        manifest = ArtifactStore.open(self.store_uri).read_manifest()
        return [shard_actor_name(self.prefix, s.shard_id, r)
                for s in manifest.shards for r in range(int(self.launch.get("replicas", 1)))]

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.ttl_s / 4))
            async with self._guard():
                self._prune()
                quiet = time.monotonic() - self.last_held
                if self.holders or quiet < self.ttl_s:
                    continue
                if self.live:
                    await self._retire()
                    self.last_held = time.monotonic()
                    continue
                log.info("index tier %s: no holders for %.0fs; lease exits", self.prefix, quiet)
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return


class SharedIndexTier:
    """A Retriever replica's side of the lease (see the module docstring)."""

    def __init__(self, store_uri: str, build_id: str, *, app_name: str, holder: str, launch: dict[str, Any],
                 ttl_s: float = LEASE_TTL_S, timeout_s: float = 10.0) -> None:
        self.store_uri, self.launch, self.holder, self.ttl_s = store_uri, launch, holder, ttl_s
        self.timeout_s = timeout_s
        self.namespace, self.prefix = tier_identity(app_name, build_id, store_uri, launch)
        self._handle: Any = None

    def _lease(self, fresh: bool = False) -> Any:
        if fresh or self._handle is None:
            self._handle = IndexTierLease.options(
                name=f"{self.prefix}-lease", namespace=self.namespace, lifetime="detached", get_if_exists=True,
            ).remote(self.namespace, self.prefix, self.store_uri, self.launch, self.ttl_s)
        return self._handle

    def missing(self, shard_ids: list[int]) -> list[tuple[int, int]]:
        """``(shard position, replica)`` of the tier's shard actors whose names are free: gone for good."""
        gone = []
        for s, shard_id in enumerate(shard_ids):
            for r in range(int(self.launch.get("replicas", 1))):
                try:
                    ray.get_actor(shard_actor_name(self.prefix, shard_id, r), namespace=self.namespace)
                except ValueError:
                    gone.append((s, r))
        return gone

    def acquire(self) -> ShardedIndex:
        """Register with the tier's lease and return a client over its shard actors."""
        last: Exception | None = None
        for attempt in range(5):  # a lease that is exiting right now is replaced by a fresh one
            try:
                replicas = ray.get(self._lease(fresh=attempt > 0).acquire.remote(self.holder))
                return ShardedIndex(replicas, timeout_s=self.timeout_s, actor_resources=self._ask())
            except ray.exceptions.RayActorError as exc:
                last = exc
                time.sleep(0.5 * (attempt + 1))
        raise RuntimeError(f"could not acquire index tier {self.prefix}: {last}")

    def _ask(self) -> dict[str, float]:
        from longrag.index.artifacts import ArtifactStore

        return actor_ask(ArtifactStore.open(self.store_uri).read_manifest(), placement_of(self.launch))

    async def renew(self) -> bool:
        """Renew this holder's lease; False when the lease is gone (the caller re-acquires)."""
        try:
            await asyncio.wait_for(asyncio.wrap_future(self._lease().renew.remote(self.holder).future()),
                                   self.timeout_s)
            return True
        except ray.exceptions.RayActorError:
            return False
        except asyncio.TimeoutError:  # a slow lease is not a lost one
            return True

    async def release(self) -> int | None:
        try:
            ref = self._lease().release.remote(self.holder)
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), 60)
        except Exception as exc:  # the lease's reaper cleans up after a holder that could not release
            log.warning("could not release index tier %s: %s", self.prefix, exc)
            return None


class TieredIndex:
    """The ``Retriever`` deployment's default index backend: a holder of the app's shared index tier.

    Constructed as every index backend is (``index_cls(index_uri, config, app_name=, holder=)``,
    see :class:`serve.deployments.Retriever`): it takes a lease on the tier, waits until every shard
    has loaded, and offers the search API of :class:`actors.sharded_index.ShardedIndex` plus the
    lease's ``renew``/``release``."""

    def __init__(self, index_uri: str, config: "IndexConfig", *, app_name: str, holder: str,
                 ready_timeout_s: float = 300.0) -> None:
        from longrag.index.artifacts import ArtifactStore

        self.manifest = ArtifactStore.open(index_uri).read_manifest()
        self.tier = SharedIndexTier(
            index_uri, self.manifest.build_id, app_name=app_name, holder=holder,
            launch=launch_settings(config),
            timeout_s=config.search_timeout_s,
        )
        self.index = self.tier.acquire()
        self.index.wait_ready(timeout_s=ready_timeout_s)

    async def search(self, queries: Any, k: int, texts: list[str] | None = None, fusion: Any = None) -> Any:
        if texts is not None:
            require_lexical(self.manifest)  # a clear client error, not every replica failing in turn
        return await self.index.search(queries, k, texts, fusion)

    async def retrieve_units(self, hits: list[Any], query: Any = None) -> list[Any]:
        return await self.index.retrieve_units(hits, query)

    async def liveness(self) -> list[list[bool]]:
        return await self.index.liveness()

    async def renew(self) -> None:
        """Renew the lease; a lost lease is acquired again (see the module docstring)."""
        if not await self.tier.renew():
            self.index = await asyncio.to_thread(self.tier.acquire)

    async def repair(self) -> list[tuple[int, int]]:
        """Re-create the shard actors that are gone for good (see the module docstring) and use the
        new handles; returns the ``(shard, replica)`` pairs re-created. The new replicas count as
        not live until they have loaded and answer a ping."""
        shard_ids = [s.shard_id for s in self.manifest.shards]
        gone = await asyncio.to_thread(self.tier.missing, shard_ids)
        if not gone:
            return []
        log.warning("index tier %s: re-creating shard replicas gone for good: %s", self.tier.prefix,
                    ", ".join(f"shard {s} replica {r}" for s, r in gone))
        fresh = await asyncio.to_thread(self.tier.acquire)
        live = [list(row) for row in self.index.live]
        for s, r in gone:
            live[s][r] = False
        self.index.replace_replicas(fresh.replicas, live)
        return gone

    async def retire(self) -> None:
        """A newer build took over (the Retriever has drained this one): as :meth:`release`."""
        await self.release()

    async def release(self) -> None:
        await self.tier.release()
