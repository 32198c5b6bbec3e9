"""serve.run's reading of Serve's "replicas ... taken more than 30s to be scheduled" messages."""

from __future__ import annotations

from serve.run import TRANSIENT_GRACE_S, missing_resources, shortage_grace_s

HEAD = ("Deployment 'LLMServer:reader' in application 'llm' has 1 replicas that have taken more than 30s to be "
        "scheduled. This may be due to waiting for the cluster to auto-scale or for a runtime environment to be "
        "installed. Resources required for each replica: ")  # fmt: skip


def test_a_plain_replica_short_of_cpus():
    msg = HEAD + '{"CPU": 1}, total resources available: {"CPU": 0.15}. Use `ray status` for more details.'
    assert missing_resources(msg) == {"CPU": 1.0}


def test_a_placement_group_replica_is_read_as_the_sum_of_its_bundles():
    """A ray.serve.llm LLMServer asks for a placement group; Serve lists its bundles (seen with vLLM on CPU)."""
    msg = HEAD + '[{"GPU": 0.0, "CPU": 2.0}, {"CPU": 1.0}], total resources available: {"CPU": 2.5}. Use `ray status`.'
    assert missing_resources(msg) == {"CPU": 3.0}
    fits = HEAD + '[{"GPU": 0.0, "CPU": 1.1}], total resources available: {"CPU": 1.5}. Use `ray status`.'
    assert missing_resources(fits) is None


def test_other_messages_are_not_a_shortage():
    assert missing_resources("Deployment 'X' is starting its replicas.") is None
    assert missing_resources(HEAD + "[{oops}], total resources available: {}.") is None


def test_a_shortage_the_cluster_could_meet_gets_a_grace_period():
    total = {"CPU": 4.0, "memory": 8e9}
    # more than the cluster has at all: fail after the configured timeout (0: at once)
    assert shortage_grace_s({"CPU": 8.0}, total, 0.0) == 0.0
    assert shortage_grace_s({"index": 1.0}, total, 30.0) == 30.0
    # within the total (other replicas hold it while they start): at least the grace period
    assert shortage_grace_s({"CPU": 1.0}, total, 0.0) == TRANSIENT_GRACE_S
    assert shortage_grace_s({"CPU": 1.0}, total, 300.0) == 300.0
