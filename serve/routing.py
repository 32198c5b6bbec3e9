"""Route a reader's LLM call to the replica whose unit KV cache holds its top unit.

The llama.cpp backend keeps the KV state of hot top units (:mod:`longrag.llm.kvcache`): a question
whose top unit was read before on the same replica skips evaluating it (seconds on a CPU). Serve's
default router (power of two choices) sends a call to either of two random replicas, so with N
replicas a hot unit's state is built N times and each replica's RAM tier holds all the hot units
instead of its share. :class:`UnitAffinityRouter` sends every call that carries a ``cache_prefix``
(the reader's ``documents_head``: the system message and the top unit) to the replica that ranks
first for that prefix by rendezvous hashing (highest random weight over the replica ids: stable
while replicas come and go, only the keys of a removed replica move), unless that replica's queue
is longer than the shortest by more than ``max_imbalance`` -- then the call goes to the least
loaded replica, as the default router would send it (bounded-load affinity: one hot unit cannot
queue behind itself while another replica idles). Calls without a prefix (chat without retrieval,
the dual stages, the bridge call) are routed by power of two choices.

``serve.llm_routing: unit_affinity`` (the default) sets it on the ``LLMServer`` deployment
(``serve/app.py``); ``pow2`` keeps Serve's default. Measured with ``longrag bench unit_cache_routing``
(docs/benchmarks.md, "Unit KV cache across replicas").
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

__all__ = ["UnitAffinityRouter", "affinity_rank", "routing_key"]

#: The keyword argument of ``LLMServer.chat`` / ``stream_chat`` that names the cached prefix.
PREFIX_ARG = "cache_prefix"


def routing_key(prefix: str) -> bytes:
    """A fixed-size key for a prefix (a unit's text is kilobytes): its blake2b digest."""
    return hashlib.blake2b(prefix.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _weight(key: bytes, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + replica.encode(), digest_size=8).digest(), "big")


def affinity_rank(key: bytes, replicas: Iterable[str], queue_lens: Mapping[str, int] | None = None,
                  max_imbalance: int = 2) -> list[str]:
    """The replicas in the order to try for ``key``: by rendezvous weight, best first; when the
    first's known queue is longer than the shortest known one by more than ``max_imbalance``, the
    least loaded first instead (ties by weight). Unknown queue lengths count as 0."""
    ranked = sorted(replicas, key=lambda r: _weight(key, r), reverse=True)
    if not ranked or not queue_lens:
        return ranked
    lens = {r: int(queue_lens.get(r, 0) or 0) for r in ranked}
    if lens[ranked[0]] - min(lens.values()) > max_imbalance:
        ranked.sort(key=lambda r: lens[r])  # stable: equal queues keep their weight order
    return ranked


class UnitAffinityRouter(FIFOMixin, RequestRouter):
    """Serve request router for the ``LLMServer``: unit-cache affinity with a load bound (module doc).

    ``request_router_kwargs``: ``max_imbalance`` (int, default 2), the queue-length gap past which a
    call leaves its preferred replica."""

    def initialize_state(self, **kwargs: Any) -> None:
        max_imbalance = kwargs.get("max_imbalance", 2)
        if not isinstance(max_imbalance, int) or max_imbalance < 0:
            raise ValueError(f"max_imbalance must be a non-negative int, got {max_imbalance!r}")
        self.max_imbalance = max_imbalance

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        prefix = (pending_request.kwargs or {}).get(PREFIX_ARG) if pending_request is not None else None
        if not isinstance(prefix, str) or not prefix:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        by_id: dict[str, RunningReplica] = {r.replica_id.unique_id: r for r in candidate_replicas}
        cache = self.replica_queue_len_cache
        lens = {uid: cache.get(r.replica_id) or 0 for uid, r in by_id.items()}
        order = affinity_rank(routing_key(prefix), by_id, lens, getattr(self, "max_imbalance", 2))
        # one rank per replica: the preferred one is probed first; if it refuses (full), the next
        return [[by_id[uid]] for uid in order]
