"""Which build a ``Retriever`` replica serves when its index is a build alias, and the switch when the
alias moves: open the new build beside the old, serve it once it is ready, let the requests still
on the old one finish, retire the old, and release every backend still held when the replica stops.

Apart from the deployment (:class:`serve.deployments.Retriever`, which delegates to it) and free of
Ray and Serve because its failure modes are about order and time (a switch while requests run, a
replica stopping within ``index.retire_after_s``, a new build that fails to open), which its tests
drive with fake backends, a fake alias and a fake clock (``tests/serve/test_alias_switch.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

from serve.backend import IndexBackend

if TYPE_CHECKING:
    from longrag.index.manifest import Manifest

__all__ = ["AliasSwitch"]

log = logging.getLogger(__name__)


def _resolve_alias(source: str) -> str:
    from longrag.index.alias import resolve_build

    return resolve_build(source)[0]


class AliasSwitch:
    """The backend served (:attr:`index`) for ``source``, a build or a build alias
    (:mod:`longrag.index.alias`), and those it superseded that may still hold their build
    (:attr:`retiring`).

    ``open_backend(build_uri)`` builds a backend and returns once every shard of it is ready (it runs
    in a worker thread); ``resolve(source)`` reads the alias (default: :func:`longrag.index.alias.resolve_build`);
    ``check(build_uri)``, where given, refuses a build before it is opened by raising. ``on_switch(new)``
    runs right after the switch (the Retriever reads the new build's liveness), ``on_superseded(old)``
    once no request runs on the old build any more, before it retires (the Retriever forgets what it
    read of that build). ``clock`` and ``sleep`` are the waits' (monotonic seconds, ``asyncio.sleep``)."""

    #: how often the switch looks whether the requests on the old build have ended
    DRAIN_POLL_S = 0.05
    #: a switch still waiting for requests on the old build says so this often
    DRAIN_WARN_S = 60.0

    def __init__(self, source: str, open_backend: Callable[[str], IndexBackend], *, refresh_s: float = 0.0,
                 resolve: Callable[[str], str] = _resolve_alias, check: Callable[[str], None] | None = None,
                 on_switch: Callable[[IndexBackend], Awaitable[None]] | None = None,
                 on_superseded: Callable[[IndexBackend], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.source, self.refresh_s = source, refresh_s
        self._open, self._resolve, self._check = open_backend, resolve, check
        self._on_switch, self._on_superseded = on_switch, on_superseded
        self._clock, self._sleep = clock, sleep
        self.build_uri = resolve(source)
        self.index: IndexBackend = open_backend(self.build_uri)
        self.inflight: dict[int, int] = {}  # id(backend) -> requests running on it
        self.retiring: set[IndexBackend] = set()  # superseded backends whose hold may not have ended: close() ends them
        self.switches = 0
        self._watcher: asyncio.Task | None = None
        self._switching = asyncio.Lock()

    @property
    def manifest(self) -> Manifest:
        """The served build's."""
        return self.index.manifest

    @contextlib.contextmanager
    def using(self) -> Iterator[IndexBackend]:
        """The backend one request runs on from start to end, even across a switch: the switch
        retires it only once every request that took it has left this block."""
        backend = self.index
        self.inflight[id(backend)] = self.inflight.get(id(backend), 0) + 1
        try:
            yield backend
        finally:
            self.inflight[id(backend)] -= 1

    def watch(self) -> None:
        """Start following the alias every ``refresh_s`` on the running event loop (once; again if
        the watcher ever stopped); nothing when ``refresh_s`` is 0."""
        if self.refresh_s > 0 and (self._watcher is None or self._watcher.done()):
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await self._sleep(self.refresh_s)
            try:
                await self.refresh()
            except Exception as exc:  # a bad pointer or a new build that fails to load: keep serving this one
                log.warning("index refresh from %s failed, still serving %s: %s",
                            self.source, self.manifest.build_id, exc)

    async def refresh(self) -> str:
        """Follow the alias now; returns the build id served afterwards. A build that is refused or
        fails to open raises, and the one served before is still served."""
        async with self._switching:
            uri = await asyncio.to_thread(self._resolve, self.source)
            if uri == self.build_uri:
                return self.manifest.build_id
            if self._check is not None:
                await asyncio.to_thread(self._check, uri)
            new = await asyncio.to_thread(self._open, uri)  # returns once every shard of the new build is ready
            old = self.index
            self.index, self.build_uri = new, uri
            # kept until its hold ends, whichever way this goes: a replica stopping within
            # index.retire_after_s (or before the wait below ends) releases it in close()
            self.retiring = {b for b in self.retiring if not getattr(b, "released", False)} | {old}
            self.switches += 1
            try:
                if self._on_switch is not None:
                    await self._on_switch(new)
                # the old build is released only once no request runs on it: each request ends by its
                # replica calls' deadlines (index.search_timeout_s per replica tried), so this ends too
                waited = warned = self._clock()
                while self.inflight.get(id(old), 0):
                    if self._clock() - warned >= self.DRAIN_WARN_S:
                        warned = self._clock()
                        log.warning("build %s: %d requests still running %.0f s after the switch; released after "
                                    "them", old.manifest.build_id, self.inflight[id(old)], warned - waited)
                    await self._sleep(self.DRAIN_POLL_S)
            finally:
                self.inflight.pop(id(old), None)
                if self._on_superseded is not None:
                    self._on_superseded(old)
                await old.retire()  # its hold ends index.retire_after_s later, or in close() if that comes first
            return self.manifest.build_id

    async def close(self) -> None:
        """The replica stops: the alias is no longer followed, and every hold ends now, of the build
        served and of every superseded build still retiring (the alias moved less than
        ``index.retire_after_s`` ago); one backend's failure to release keeps no other held."""
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
        for backend in [self.index, *self.retiring]:
            try:
                await backend.release()
            except Exception:
                log.warning("could not release the index backend of build %s",
                            getattr(getattr(backend, "manifest", None), "build_id", "?"), exc_info=True)
