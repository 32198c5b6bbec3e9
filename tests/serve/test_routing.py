"""Unit-cache affinity for the LLMServer's calls (serve.routing), without Ray: the preferred replica
of a key is stable, only a removed replica's keys move, keys spread evenly, and a long queue sends
the call to the least loaded replica. Through Serve: tests/serve/test_app_fakes.py."""

from __future__ import annotations

from collections import Counter

from serve.routing import affinity_rank, routing_key

REPLICAS = ["r1", "r2", "r3", "r4"]
KEYS = [routing_key(f"Documents:\n\nTitle: unit {i}\n...") for i in range(4000)]


def test_a_key_prefers_one_replica_whatever_the_order_given():
    for key in KEYS[:200]:
        first = affinity_rank(key, REPLICAS)
        assert sorted(first) == sorted(REPLICAS)
        assert affinity_rank(key, list(reversed(REPLICAS)))[0] == first[0]


def test_keys_spread_evenly():
    counts = Counter(affinity_rank(k, REPLICAS)[0] for k in KEYS)
    assert set(counts) == set(REPLICAS)
    assert max(counts.values()) < 1.15 * len(KEYS) / len(REPLICAS)


def test_only_the_removed_replicas_keys_move_and_a_new_replica_takes_a_share():
    before = {k: affinity_rank(k, REPLICAS)[0] for k in KEYS}
    after = {k: affinity_rank(k, REPLICAS[:3])[0] for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(before[k] == "r4" for k in moved)
    grown = {k: affinity_rank(k, [*REPLICAS, "r5"])[0] for k in KEYS}
    gained = [k for k in KEYS if grown[k] != before[k]]
    assert all(grown[k] == "r5" for k in gained)
    assert 0.1 < len(gained) / len(KEYS) < 0.3  # ~1/5 of the keys


def test_a_long_queue_sends_the_call_to_the_least_loaded_replica():
    key = KEYS[0]
    preferred = affinity_rank(key, REPLICAS)
    lens = {r: 0 for r in REPLICAS}
    lens[preferred[0]] = 2
    assert affinity_rank(key, REPLICAS, lens, max_imbalance=2) == preferred  # within the bound: stays
    lens[preferred[0]] = 3
    ranked = affinity_rank(key, REPLICAS, lens, max_imbalance=2)
    assert ranked[0] != preferred[0] and lens[ranked[0]] == 0 and ranked[-1] == preferred[0]
    assert ranked[:3] == [r for r in preferred if r != preferred[0]]  # equal queues keep their weight order
