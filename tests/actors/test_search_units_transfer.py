"""Issue 40, item 6: a dense retrieval ships only the units that won. Below ``fused_fetch_max_units``
(shards x k) each shard sends its own top k with their rows in one call; above it the shards send ids and
scores and only the k winners are fetched. Both give the same ranked units with the same text. Without
Ray: the build's real shards (:class:`actors.index_shard.IndexShardImpl`) behind in-process handles that
count the unit rows each call ships."""

from __future__ import annotations

import asyncio

import pytest

from actors.index_shard import IndexShardImpl
from actors.sharded_index import ShardedIndex
from tests.fakes import HashEncoder, write_tiny_build

pytestmark = pytest.mark.timeout(60)
DOCS = [(f"Title {i}", f"Document {i} talks about topic {i % 7}. It also names item {i * 3}.") for i in range(40)]


class _Handle:
    """``handle.method.remote(*args)`` on a shard in this process; ``rows`` counts unit rows shipped."""

    def __init__(self, impl: IndexShardImpl) -> None:
        self.impl, self.rows = impl, 0

    def __getattr__(self, method: str):
        handle = self

        class _Method:
            def remote(self, *args):
                async def run():
                    out = getattr(handle.impl, method)(*args)
                    if method in ("search_units", "get_units"):
                        handle.rows += len(out[1] if method == "search_units" else out)
                    return out

                task = asyncio.ensure_future(run())
                task.cancel_call = task.cancel
                return task

        return _Method()


@pytest.mark.parametrize("evidence", [False, True])
def test_above_the_threshold_only_the_winners_are_fetched_and_the_units_are_the_same(tmp_path, evidence):
    uri = write_tiny_build(tmp_path / "b", DOCS, shards=4)
    handles = [_Handle(IndexShardImpl(uri, s)) for s in range(4)]
    query = HashEncoder().encode_queries(["topic 3 item 9"])[0]
    k = 5

    def run(fused_max: int):
        for h in handles:
            h.rows = 0
        index = ShardedIndex(handles, fused_fetch_max_units=fused_max)
        res, units = asyncio.run(index.search_units(query, k, evidence))
        return res, units, sum(h.rows for h in handles)

    fused, fused_units, fused_rows = run(fused_max=4 * k)  # 20 units: one call per shard
    split, split_units, split_rows = run(fused_max=4 * k - 1)  # above: ids first, then the winners
    assert fused_rows == 4 * k and split_rows == k
    assert [h.unit_id for h in split.hits[0]] == [h.unit_id for h in fused.hits[0]] and len(split_units) == k
    for a, b in zip(fused_units, split_units):
        assert (a.unit_id, a.score, a.text, a.titles) == (b.unit_id, b.score, b.text, b.titles) and a.text
    assert not split.coverage.degraded and split.coverage.answered == 4
