"""A failover does not poll Serve (issue 40, item 7): ``serve.status()`` costs ~90 ms idle and ~375 ms p50 /
745 ms p95 under load at 8 shards x 4 replicas on a 2-CPU local Ray (``python -m jobs.bench serve-status``),
and the Retriever read it up to 6 times after every call that needed a second try. The failed call's own
error (Ray's ``RayActorError``: the replica's actor died or is unreachable, with its id) says which replica
is gone: the redundancy drops by it at once, each lost replica counted once, and the platform's counts are
read again no more than every ``recount_min_s`` (and on the Retriever's health check). Without Ray: fake
handles, the platform read counted."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from ray.exceptions import ActorUnavailableError

from actors.sharded_index import ShardedIndex
from longrag.types import UnitHit

pytestmark = pytest.mark.timeout(60)
SHARDS, REPLICAS = 8, 4


class _Handle:
    """One shard's deployment handle: a call meeting a replica in ``dead`` fails with Ray's error
    naming that replica's actor (Serve's router then routes the retry to another replica)."""

    def __init__(self, shard: int, dead: list[str]) -> None:
        self.shard, self.dead, self.calls = shard, dead, 0

    def __getattr__(self, method: str):
        handle = self

        class _Method:
            def remote(self, queries, k):
                handle.calls += 1

                class _Response:
                    def __await__(inner):
                        return handle._answer(queries, k).__await__()

                    def cancel(inner):
                        pass

                return _Response()

        return _Method()

    async def _answer(self, queries, k):
        await asyncio.sleep(0)
        if self.dead and self.calls % 2 == 1:  # every other call meets a dead replica
            actor = self.dead[(self.calls // 2) % len(self.dead)]
            raise ActorUnavailableError(f"replica {actor} is gone (a test fake)", bytes.fromhex(actor))
        return [[UnitHit(f"u{self.shard}", 1.0 / (1 + self.shard), f"u{self.shard}:0", self.shard)]
                for _ in range(len(queries))]


class _Counted(ShardedIndex):
    reads = 0

    async def replica_counts(self):
        type(self).reads += 1  # what serve.status() would cost each time
        return [(REPLICAS, REPLICAS)] * SHARDS


def test_a_failover_takes_the_lost_replica_from_its_error_and_does_not_poll_serve():
    dead = {3: ["aa" * 16], 5: ["bb" * 16, "cc" * 16]}
    index = _Counted([_Handle(s, dead.get(s, [])) for s in range(SHARDS)], timeout_s=5, replicas=REPLICAS)
    _Counted.reads = 0
    queries = np.ones((1, 4), dtype=np.float32)

    async def scenario() -> list:
        seen = []
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while loop.time() - t0 < 2.5:  # searches keep failing over for 2.5 s
            res = await index.search(queries, 2)
            assert not res.coverage.degraded and res.coverage.failovers > 0
            seen.append(index.redundancy())
            await asyncio.sleep(0.02)
        return seen

    seen = asyncio.run(scenario())
    last = {r.shard: (r.live, r.replicas) for r in seen[-1]}
    assert last[3] == (3, 4) and last[5] == (2, 4), "the failed calls' errors named the lost replicas"
    assert all(last[s] == (4, 4) for s in range(SHARDS) if s not in dead)
    assert _Counted.reads <= 1, f"{_Counted.reads} reads of Serve's status in 2.5 s of failovers"
