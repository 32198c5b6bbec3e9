"""A shard replica's work queue without Ray (issue 40, item 1): :class:`actors.index_shard.IndexShardReplica`'s
async methods called directly over a slow fake shard that counts how many of its calls run at once.

A call its client cancels (Serve's or the client's timeout, :class:`actors.sharded_index.ShardedIndex`
giving up on a slow replica) cannot stop the FAISS call already running in its thread: the next call
must wait for that thread, not start beside it; a call cancelled before its turn never runs; and the
calls a replica holds (running, waiting, or abandoned by their clients and not yet finished) are
bounded: one more is refused at once with :class:`actors.index_shard.ReplicaBusyError`, which the
sharded client tries again after a short backoff, within the shard's deadline (then the shard named in
the coverage)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from actors import index_shard
from actors.index_shard import IndexShardReplica
from actors.sharded_index import ShardedIndex

#: Absent before the fix: then nothing is refused (``except ()`` catches nothing).
Busy = getattr(index_shard, "ReplicaBusyError", ())


class SlowShard:
    """A shard whose searches sleep ``work_s`` in their thread and count the calls running at once."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.running = self.max_running = self.calls = 0
        self._lock = threading.Lock()

    def search(self, queries, k):
        with self._lock:
            self.calls += 1
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            time.sleep(self.work_s)
            return [[] for _ in range(len(queries))]
        finally:
            with self._lock:
                self.running -= 1

    def info(self):
        return {"shard_id": 0}


class FakeReplica(IndexShardReplica):
    """The real replica over :class:`SlowShard` instead of a shard loaded from a store."""

    def _load(self, work_s: float, **kwargs):
        return SlowShard(work_s)


Q = np.zeros((1, 4), dtype=np.float32)


def test_a_cancelled_call_does_not_let_the_next_one_run_beside_it():
    """The first search is cancelled 0.1 s into its 0.6 s of work (its thread keeps running): the
    second search starts only when that thread is done, never beside it."""

    async def main():
        replica = FakeReplica(0.6, max_pending=4)
        first = asyncio.ensure_future(replica.search(Q, 5))
        await asyncio.sleep(0.1)
        first.cancel()
        t0 = time.perf_counter()
        await replica.search(Q, 5)
        return replica, time.perf_counter() - t0

    replica, took = asyncio.run(main())
    assert replica.impl.max_running == 1, f"{replica.impl.max_running} searches ran at once on one replica"
    assert took >= 0.95, f"the second search took {took:.2f} s: it did not wait for the cancelled one's thread"
    assert replica.impl.calls == 2


def test_a_call_cancelled_before_its_turn_never_runs():
    """A search waiting behind a running one is cancelled: its work never starts, and the replica's
    counts drop as the running one ends."""

    async def main():
        replica = FakeReplica(0.4, max_pending=4)
        first = asyncio.ensure_future(replica.search(Q, 5))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(replica.search(Q, 5))
        await asyncio.sleep(0.05)
        second.cancel()
        await first
        await asyncio.sleep(0.1)  # the abandoned call's thread, if any, passes its turn
        return replica, await replica.info()

    replica, info = asyncio.run(main())
    assert replica.impl.calls == 1, "a search whose client had gone still ran"
    assert info["busy"] == 0 and info.get("pending", 0) == 0, info


def test_under_load_with_timeouts_one_search_at_a_time_and_the_queue_is_bounded():
    """60 clients, one every 10 ms, each waiting at most 0.15 s for a 0.05 s search, on a replica that
    holds 4 calls: the searches never overlap, the replica never holds more than 4 (abandoned ones
    included), a refused call is refused at once with ReplicaBusyError, and once the load stops
    the replica is free again within its bound (no backlog of abandoned work)."""
    work_s, max_pending = 0.05, 4

    async def main():
        replica = FakeReplica(work_s, max_pending=max_pending)
        held: list[int] = []
        outcomes: list[tuple[str, float]] = []

        async def client():
            t0 = time.perf_counter()
            try:
                await asyncio.wait_for(replica.search(Q, 5), 0.15)
                outcomes.append(("ok", time.perf_counter() - t0))
            except TimeoutError:
                outcomes.append(("timeout", time.perf_counter() - t0))
            except Busy:
                outcomes.append(("busy", time.perf_counter() - t0))
            held.append((await replica.info()).get("pending", 0))

        tasks = []
        for _ in range(60):
            tasks.append(asyncio.ensure_future(client()))
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        t0 = time.perf_counter()
        await replica.search(Q, 5)  # after the load: waits at most for the work the replica still holds
        return replica, outcomes, held, time.perf_counter() - t0

    replica, outcomes, held, after = asyncio.run(main())
    kinds = {k: sum(1 for o, _ in outcomes if o == k) for k in ("ok", "timeout", "busy")}
    assert replica.impl.max_running == 1, f"{replica.impl.max_running} searches ran at once on one replica ({kinds})"
    assert kinds["busy"] > 0, f"nothing was refused under 3x overload: the replica's queue is unbounded ({kinds})"
    assert max(held) <= max_pending, f"the replica held {max(held)} calls, more than its {max_pending}"
    assert max(t for o, t in outcomes if o == "busy") < 0.05, "a refused call was not refused at once"
    assert after < (max_pending + 1) * work_s + 0.25, f"a search after the load waited {after:.2f} s"
    # every admitted call ran or was skipped: the calls that ran are at most those admitted
    assert replica.impl.calls <= len(outcomes) - kinds["busy"] + 1


class _Handle:
    """A shard deployment's handle over one in-process replica: ``handle.search.remote(...)`` is an
    awaitable with ``cancel()``, as Serve's ``DeploymentResponse``."""

    def __init__(self, replica) -> None:
        self.replica = replica

    def __getattr__(self, method):
        replica = self.replica

        class _Method:
            def remote(self, *args):
                task = asyncio.ensure_future(getattr(replica, method)(*args))
                return task

        return _Method()


def test_a_full_replica_is_a_failed_try_named_in_the_coverage():
    """A replica that stays full past the shard's deadline (2 tries x 0.3 s) refuses every try at
    once: the client backs off between them, gives up by the deadline (not the 1.5 s the running
    search holds the replica), and names the shard with the ReplicaBusyError."""

    async def main():
        replica = FakeReplica(1.5, max_pending=1)
        running = asyncio.ensure_future(replica.search(Q, 5))
        await asyncio.sleep(0.05)
        index = ShardedIndex([_Handle(replica)], timeout_s=0.3)
        t0 = time.perf_counter()
        result = await index.search(Q, 5)
        took = time.perf_counter() - t0
        await running
        return result, took, replica.impl.calls

    result, took, calls = asyncio.run(main())
    cov = result.coverage
    assert cov.answered == 0 and cov.failovers >= 1, cov
    assert "ReplicaBusyError" in cov.errors[0] and took < 0.9, (cov.errors, took)
    assert calls == 1  # every try was refused, none ran


def test_a_busy_single_replica_is_waited_for_not_dropped():
    """Issue 44 item 3.4: the shard's only replica is full for 0.3 s (one search running, max_pending=1).
    Trying again at once would be refused again and drop the shard; after a short backoff within the
    shard's deadline the replica has room and the shard answers, its refusals counted as failovers."""

    async def main():
        replica = FakeReplica(0.3, max_pending=1)
        running = asyncio.ensure_future(replica.search(Q, 5))
        await asyncio.sleep(0.05)
        index = ShardedIndex([_Handle(replica)], timeout_s=2.0)
        t0 = time.perf_counter()
        result = await index.search(Q, 5)
        took = time.perf_counter() - t0
        await running
        return result, took, replica.impl.calls

    result, took, calls = asyncio.run(main())
    cov = result.coverage
    assert cov.answered == 1 and not cov.degraded and cov.errors == {}, cov
    assert cov.failovers >= 1 and calls == 2, (cov, calls)  # refused, then waited for, then run
    assert took < 1.5, took
