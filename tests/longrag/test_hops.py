"""The iterative retrieval loop (longrag.retrieval.hops) over a fake search and a fake LLM."""

from __future__ import annotations

import asyncio

import pytest

from longrag.llm.base import ChatResult
from longrag.retrieval.hops import clean_bridge, iterate, merge_hops
from longrag.types import RetrievedUnit


def _unit(uid: str, chunk: str = "") -> RetrievedUnit:
    return RetrievedUnit(unit_id=uid, score=1.0, shard=0, best_chunk_id=f"{uid}:0000", best_chunk=chunk or f"text {uid}",
                         titles=[uid], text=f"{uid} text")


class FakeLLM:
    """Answers each prompt with the next reply; records the prompts."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.prompts = list(replies), []

    async def chat(self, messages, *, max_tokens, temperature=None, stop=None, cache_prefix=None):
        self.prompts.append(messages[-1]["content"])
        return ChatResult(text=self.replies.pop(0), prompt_tokens=50, completion_tokens=3, latency_ms=1.0, model="fake")


def _search(index: dict[str, list[str]], calls: list[str]):
    async def search(query: str, k: int):
        calls.append(query)
        return [_unit(u, chunk=f"evidence of {u}") for u in index.get(query, ["z1", "z2"])][:k]
    return search


def test_second_hop_searches_with_the_bridge_and_merges_after_the_first_top_unit():
    q = "Who founded the company that makes the iPhone?"
    index = {q: ["a", "b", "c"], f"{q} Apple": ["d", "a", "e"]}
    calls: list[str] = []
    llm = FakeLLM(["Apple."])
    res = asyncio.run(iterate(q, 4, _search(index, calls), llm, max_hops=2))
    assert calls == [q, f"{q} Apple"]
    assert [u.unit_id for u in res.units] == ["a", "d", "e", "b"]
    assert [h.bridge for h in res.hops] == [None, "Apple"] and res.hops[-1].stopped == "max hops"
    assert "evidence of a" in llm.prompts[0] and "evidence of b" in llm.prompts[0] and q in llm.prompts[0]


def test_third_hop_keeps_each_earlier_hops_top_unit():
    q = "q?"
    index = {q: ["a", "b"], "q? X": ["c", "d"], "q? X Y": ["e", "a"]}
    res = asyncio.run(iterate(q, 5, _search(index, []), FakeLLM(["X", "Y"]), max_hops=3))
    assert [u.unit_id for u in res.units] == ["a", "c", "e", "b", "d"]
    assert len(res.hops) == 3 and res.llm_calls == 2


@pytest.mark.parametrize("reply, why", [("None", "no bridge"), ("", "no bridge"), ("I don't know.", "no bridge"),
                                         ("word " * 13, "no bridge")])
def test_no_bridge_stops_after_the_first_hop(reply, why):
    calls: list[str] = []
    res = asyncio.run(iterate("q?", 3, _search({"q?": ["a", "b"]}, calls), FakeLLM([reply]), max_hops=3))
    assert calls == ["q?"] and [u.unit_id for u in res.units] == ["a", "b"]
    assert res.hops[0].stopped == why and res.hops[0].llm_ms > 0


def test_a_repeated_bridge_ends_the_loop():
    calls: list[str] = []
    res = asyncio.run(iterate("q?", 3, _search({}, calls), FakeLLM(["X", "x"]), max_hops=3))
    assert calls == ["q?", "q? X"] and res.hops[-1].stopped == "bridge repeated"


def test_one_hop_makes_no_llm_call():
    llm = FakeLLM([])
    res = asyncio.run(iterate("q?", 2, _search({"q?": ["a", "b", "c"]}, []), llm, max_hops=1))
    assert [u.unit_id for u in res.units] == ["a", "b"] and llm.prompts == []
    with pytest.raises(ValueError):
        asyncio.run(iterate("q?", 2, _search({}, []), llm, max_hops=0))


def test_clean_bridge_and_merge_by_hand():
    assert clean_bridge('Answer: "Apple Inc."\nmore', "q", []) == ("Apple Inc", None)
    assert clean_bridge("Apple", "q", ["apple"]) == (None, "bridge repeated")
    a, b, c = _unit("a"), _unit("b"), _unit("c")
    assert [u.unit_id for u in merge_hops([[a, b], [b, c]], 3)] == ["a", "b", "c"]
    assert merge_hops([], 3) == []
