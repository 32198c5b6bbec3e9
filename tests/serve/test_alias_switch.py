"""The Retriever's alias switch (:class:`serve.alias_switch.AliasSwitch`) without Ray or Serve: fake
backends, an alias that is a dict, a clock the test moves (issue 45, item 4).

Its cases are those a rollout meets: the alias moves while requests run on the old build, the replica
stops within ``index.retire_after_s`` of a switch, a new build fails to open or is refused."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from serve.alias_switch import AliasSwitch
from serve.backend import IndexBackend

pytestmark = pytest.mark.timeout(30)
RETIRE_AFTER_S = 30.0


class Clock:
    """Monotonic seconds that pass only when the test says so (:meth:`advance`); :meth:`sleep` waits
    for them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self.now + seconds)

    async def sleep_until(self, deadline: float) -> None:
        while self.now < deadline:
            await asyncio.sleep(0.001)

    async def advance(self, seconds: float, step: float = 1.0) -> None:
        """Time moves on by ``seconds``, ``step`` at a time, every waiting task run at each step."""
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            await asyncio.sleep(0.005)


async def until(condition, timeout_s: float = 10.0) -> None:
    """Real time passes (worker threads open and resolve builds) until ``condition()``."""
    for _ in range(int(timeout_s / 0.002)):
        if condition():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the condition did not come true")


class FakeBackend:
    """A build's backend as :class:`serve.index_app.ServeIndex` holds it: ``retire`` ends the hold
    ``RETIRE_AFTER_S`` later (on the fake clock), ``release`` at once; every call recorded."""

    def __init__(self, uri: str, clock: Clock, events: list[tuple[str, str]]) -> None:
        self.manifest = SimpleNamespace(build_id=uri.rsplit("/", 1)[-1])
        self.clock, self.events = clock, events
        self.released = False
        self._retiring: asyncio.Task | None = None

    async def search(self, queries, k: int, texts=None, fusion=None): ...
    async def retrieve_units(self, hits, query=None, evidence: bool = True): ...
    async def search_units(self, query, k: int, evidence: bool = False): ...

    async def liveness(self):
        return []

    async def retire(self) -> None:
        self.events.append(("retire", self.manifest.build_id))
        deadline = self.clock.now + RETIRE_AFTER_S

        async def later() -> None:
            await self.clock.sleep_until(deadline)
            await self.release()

        self._retiring = asyncio.get_running_loop().create_task(later())

    async def release(self) -> None:
        if not self.released:
            self.released = True
            self.events.append(("release", self.manifest.build_id))


class World:
    """The alias (``pointer``), the builds that fail to open (``broken``) and what happened (``events``)."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.pointer = "builds/b1"
        self.broken: set[str] = set()
        self.events: list[tuple[str, str]] = []
        self.opened: list[FakeBackend] = []
        self.superseded: list[str] = []
        self.switched: list[str] = []

    def open(self, uri: str) -> FakeBackend:
        if uri in self.broken:
            raise RuntimeError(f"the index application of {uri} did not start (a test fault)")
        backend = FakeBackend(uri, self.clock, self.events)
        self.opened.append(backend)
        self.events.append(("open", backend.manifest.build_id))
        return backend

    def switch(self, **kwargs) -> AliasSwitch:
        async def on_switch(new) -> None:
            self.switched.append(new.manifest.build_id)

        kwargs.setdefault("on_switch", on_switch)
        return AliasSwitch("alias", self.open, resolve=lambda source: self.pointer, clock=self.clock,
                           sleep=self.clock.sleep, on_superseded=lambda old: self.superseded.append(old.manifest.build_id),
                           **kwargs)


@pytest.fixture
def world() -> World:
    return World()


def test_the_fake_backend_is_an_index_backend(world):
    assert isinstance(world.open("builds/b0"), IndexBackend)


def test_a_new_generation_is_switched_to_and_the_old_retired(world):
    async def scenario() -> None:
        alias = world.switch()
        first = alias.index
        assert await alias.refresh() == "b1" and alias.switches == 0  # the alias did not move: nothing opened
        assert world.events == [("open", "b1")]
        world.pointer = "builds/b2"
        assert await alias.refresh() == "b2"
        assert alias.index is world.opened[1] and alias.manifest.build_id == "b2" and alias.build_uri == "builds/b2"
        assert alias.switches == 1 and world.switched == ["b2"] and world.superseded == ["b1"]
        assert world.events == [("open", "b1"), ("open", "b2"), ("retire", "b1")]  # retired, not released
        assert alias.retiring == {first} and not first.released
        await world.clock.advance(RETIRE_AFTER_S - 1)
        assert not first.released  # its hold ends retire_after_s later ...
        await world.clock.advance(1)
        await until(lambda: first.released)
        assert world.events[-1] == ("release", "b1")  # ... then
        world.pointer = "builds/b3"
        await alias.refresh()
        assert alias.retiring == {world.opened[1]}  # a retirement that ended is forgotten at the next switch
        await alias.close()

    asyncio.run(scenario())


def test_the_old_build_retires_only_once_its_requests_end(world, caplog):
    async def scenario() -> None:
        alias = world.switch()
        old = alias.index
        with alias.using() as backend:
            assert backend is old
            world.pointer = "builds/b2"
            switching = asyncio.create_task(alias.refresh())
            await until(lambda: alias.index is not old)  # new requests go to the new build at once
            with caplog.at_level(logging.WARNING, logger="serve.alias_switch"):
                await world.clock.advance(61.0)
            assert not switching.done()
            with alias.using() as newer:
                assert newer is alias.index
            assert ("retire", "b1") not in world.events and world.superseded == []
            assert "1 requests still running 60 s after the switch" in caplog.text
        await world.clock.advance(1.0)  # the switch looks again
        assert await switching == "b2"
        assert world.events[-1] == ("retire", "b1") and world.superseded == ["b1"]
        assert alias.inflight == {id(alias.index): 0}
        await alias.close()

    asyncio.run(scenario())


def test_close_releases_the_served_build_and_every_one_still_retiring(world):
    async def scenario() -> None:
        alias = world.switch()
        for n in (2, 3):
            world.pointer = f"builds/b{n}"
            await alias.refresh()
        assert [b.released for b in world.opened] == [False, False, False]  # b1, b2 retire for retire_after_s
        world.opened[0].release = broken_release  # one backend failing to release keeps no other held
        await alias.close()  # the replica stops well within retire_after_s
        assert {b for kind, b in world.events if kind == "release"} == {"b2", "b3"}
        assert world.opened[1].released and world.opened[2].released

    async def broken_release() -> None:
        raise RuntimeError("the holder registry did not answer (a test fault)")

    asyncio.run(scenario())


@pytest.mark.parametrize("fault", ["open", "check", "liveness"])
def test_a_new_build_that_fails_keeps_the_old_one_served(world, fault):
    """A new build that fails to open, or is refused (``check``: a dimension mismatch), leaves the
    old one served and nothing retired; the next refresh tries again. Once switched, a failure after
    the switch (the new build's liveness) still retires the old one: nothing is left held."""
    refused: list[str] = []

    def check(uri: str) -> None:
        if fault == "check" and uri == "builds/b2":
            refused.append(uri)
            raise ValueError("build b2 holds 32-dimensional vectors (a test fault)")

    async def liveness_fails(new) -> None:
        raise RuntimeError("the new build's replicas could not be counted (a test fault)")

    async def scenario() -> None:
        alias = world.switch(check=check, **({"on_switch": liveness_fails} if fault == "liveness" else {}))
        first = alias.index
        world.pointer = "builds/b2"
        if fault == "open":
            world.broken.add("builds/b2")
        with pytest.raises((RuntimeError, ValueError), match="a test fault"):
            await alias.refresh()
        if fault == "liveness":
            assert alias.index is world.opened[1] and world.events[-1] == ("retire", "b1")
            await alias.close()
            return
        assert alias.index is first and alias.build_uri == "builds/b1" and alias.switches == 0
        assert alias.retiring == set() and ("retire", "b1") not in world.events
        assert refused == (["builds/b2"] if fault == "check" else []) and len(world.opened) == 1
        world.broken.clear()
        refused.clear()
        if fault == "check":
            world.pointer = "builds/b3"
        assert await alias.refresh() == world.pointer.rsplit("/", 1)[-1]  # tried again, and served
        assert world.events[-1] == ("retire", "b1")
        await alias.close()

    asyncio.run(scenario())


def test_the_watcher_follows_the_alias_survives_failures_and_stops_on_close(world, caplog):
    async def scenario() -> None:
        alias = world.switch(refresh_s=5.0)
        alias.watch()
        alias.watch()  # once
        await asyncio.sleep(0.01)  # the watcher starts its first wait
        world.broken.add("builds/b2")
        world.pointer = "builds/b2"
        with caplog.at_level(logging.WARNING, logger="serve.alias_switch"):
            await world.clock.advance(4.0)
            assert world.events == [("open", "b1")]  # not before refresh_s
            await world.clock.advance(1.0)
            await until(lambda: "index refresh from alias failed, still serving b1" in caplog.text)
        world.broken.clear()
        await world.clock.advance(5.0)
        await until(lambda: alias.manifest.build_id == "b2")
        watcher = alias._watcher
        await alias.close()
        await until(watcher.done)  # a stopped replica follows the alias no more
        world.pointer = "builds/b3"
        await world.clock.advance(10.0)
        assert [b.manifest.build_id for b in world.opened] == ["b1", "b2"] and world.opened[1].released

    asyncio.run(scenario())


def test_no_watcher_without_refresh_s(world):
    async def scenario() -> None:
        alias = world.switch(refresh_s=0)
        alias.watch()
        assert alias._watcher is None
        await alias.close()

    asyncio.run(scenario())
