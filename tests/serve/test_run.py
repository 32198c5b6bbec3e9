"""serve.run's reading of a replica that waits for resources, from structured data (Serve's details of
the deployment, the cluster's free resources), without Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from serve.run import (
    PLACEMENT_WAIT_S,
    TRANSIENT_GRACE_S,
    Placement,
    missing_resources,
    short_of,
    shortage_grace_s,
    waiting_ask,
)

FREE = {"CPU": 1.5, "memory": 8e9, "object_store_memory": 2e9, "node:10.0.0.1": 1.0, "index": 2.0}


def test_an_ask_that_fits_is_not_short():
    assert short_of({"CPU": 1.0}, FREE) is None
    assert short_of({"CPU": 1.5, "memory": 4e9, "index": 2.0}, FREE) is None  # exactly what is free fits
    assert short_of({}, FREE) is None


def test_short_of_cpu():
    """The per-replica ask is reported, not the difference (a 3-CPU Reader on a 2-CPU Ray: {"CPU": 3.0})."""
    assert short_of({"CPU": 3}, {"CPU": 1.2}) == {"CPU": 3.0}
    assert short_of({"CPU": 2.0, "memory": 1e9}, FREE) == {"CPU": 2.0}


def test_short_of_a_custom_resource():
    assert short_of({"CPU": 0.1, "index": 3.0}, FREE) == {"index": 3.0}


def test_short_of_gpu():
    assert short_of({"CPU": 1.0, "GPU": 1.0}, {**FREE, "GPU": 0.5}) == {"GPU": 1.0}
    assert short_of({"CPU": 2.0, "GPU": 1.0}, {**FREE, "GPU": 0.5}) == {"CPU": 2.0, "GPU": 1.0}


def test_zero_asks_are_never_short():
    assert short_of({"CPU": 0.0, "GPU": 0.0, "accelerator_type:A100": 0}, FREE) is None


def test_a_resource_the_cluster_has_none_of_is_short():
    assert short_of({"CPU": 1.0, "GPU": 1.0}, FREE) == {"GPU": 1.0}
    assert short_of({"CPU": 1.0}, {}) == {"CPU": 1.0}


# ------------------------------------------------------------------ Serve's details of one deployment
NOW = 1_000_000.0
LONG_AGO = NOW - PLACEMENT_WAIT_S - 1


def _replica(state: str = "STARTING", start: float = LONG_AGO, node: str | None = None, name: str = "r1") -> dict:
    """One ``ReplicaDetails`` as Serve's details give it (``exclude_unset``: no node_id until the actor is up)."""
    replica = {"replica_id": name, "state": state, "start_time_s": start, "actor_name": f"SERVE_REPLICA::app#Reader#{name}"}
    return {**replica, "node_id": node} if node else replica


def _deployment(*replicas: dict, required: dict | None = None) -> dict:
    return {"name": "Reader", "status": "UPDATING", "message": "anything at all", "replicas": list(replicas),
            "required_resources": {"CPU": 3} if required is None else required}


def test_a_replica_that_waited_to_be_placed_asks_for_the_required_resources():
    assert waiting_ask(_deployment(_replica()), now=NOW) == {"CPU": 3.0}
    running = _replica("RUNNING", node="n1", name="r0")
    assert waiting_ask(_deployment(running, _replica(name="r1")), now=NOW) == {"CPU": 3.0}


def test_no_ask_without_a_replica_waiting_long_enough_to_be_placed():
    assert waiting_ask(_deployment(_replica(start=NOW - 5)), now=NOW) is None  # just started
    assert waiting_ask(_deployment(_replica(start=0)), now=NOW) is None  # not started yet
    assert waiting_ask(_deployment(_replica(node="n1")), now=NOW) is None  # placed, initializing
    assert waiting_ask(_deployment(_replica("RUNNING", node="n1")), now=NOW) is None
    assert waiting_ask(_deployment(_replica("STOPPING")), now=NOW) is None
    assert waiting_ask(_deployment(), now=NOW) is None


def test_a_replica_with_a_pending_placement_group_asks_for_its_bundles():
    """A ray.serve.llm LLMServer asks for a placement group: the sum of its bundles while the group waits."""
    name = _replica()["actor_name"]
    pending = {name: ("PENDING", {"CPU": 3.0, "GPU": 0.0})}
    assert waiting_ask(_deployment(_replica(), required={"CPU": 2}), now=NOW, groups=pending) == {"CPU": 3.0, "GPU": 0.0}
    created = {name: ("CREATED", {"CPU": 3.0})}  # the group holds its resources: the worker starts
    assert waiting_ask(_deployment(_replica(), required={"CPU": 2}), now=NOW, groups=created) is None


def _placement(deployment: dict, free: dict[str, float]) -> Placement:
    return Placement({"app": {"deployments": {"Reader": deployment}}}, free, {"CPU": 2.0}, {}, NOW)


def test_missing_resources_of_a_deployment():
    """The test_app case: a Reader asking for 3 CPUs on a 2-CPU Ray (1.2 free) lacks {"CPU": 3.0}."""
    assert missing_resources("app", "Reader", _placement(_deployment(_replica()), {"CPU": 1.2})) == {"CPU": 3.0}
    fits = _deployment(_replica(), required={"CPU": 1})  # waits for something else (its worker, a runtime env)
    assert missing_resources("app", "Reader", _placement(fits, {"CPU": 1.2})) is None


def test_a_deployment_whose_details_cannot_be_read_is_not_short():
    where = _placement(_deployment(_replica()), {"CPU": 1.2})
    assert missing_resources("other", "Reader", where) is None
    assert missing_resources("app", "Retriever", where) is None
    broken = _placement({"replicas": [_replica()], "required_resources": {"CPU": "many"}}, {"CPU": 1.2})
    assert missing_resources("app", "Reader", broken) is None
    assert missing_resources("app", "Reader", Placement({}, {}, {}, {}, NOW)) is None


def test_the_comparison_is_ray_free():
    """short_of and waiting_ask run without Ray imported (a fresh interpreter: other tests may import it)."""
    code = ("import sys; from serve.run import short_of, waiting_ask; "
            "assert short_of({'CPU': 2}, {'CPU': 1}) == {'CPU': 2.0}; "
            "assert waiting_ask({'replicas': []}, now=0.0) is None; "
            "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')], 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_a_shortage_the_cluster_could_meet_gets_a_grace_period():
    total = {"CPU": 4.0, "memory": 8e9}
    # more than the cluster has at all: fail after the configured timeout (0: at once)
    assert shortage_grace_s({"CPU": 8.0}, total, 0.0) == 0.0
    assert shortage_grace_s({"index": 1.0}, total, 30.0) == 30.0
    # within the total (other replicas hold it while they start): at least the grace period
    assert shortage_grace_s({"CPU": 1.0}, total, 0.0) == TRANSIENT_GRACE_S
    assert shortage_grace_s({"CPU": 1.0}, total, 300.0) == 300.0


def test_direct_ingress_env_is_set_for_the_block_and_restored(monkeypatch):
    """Ray Serve's direct ingress: the ingress replicas' port range starts at the public port, the
    proxy goes after it, and the process environment is as before once the block ends."""
    from serve.run import direct_ingress, direct_ingress_env, direct_ingress_proxy_port

    monkeypatch.delenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", raising=False)
    monkeypatch.setenv("RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT", "31000")
    assert direct_ingress_env(8000, 2) == {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                                           "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "8000",
                                           "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "8002"}
    assert direct_ingress_proxy_port() is None
    with direct_ingress(8000):
        assert direct_ingress_proxy_port() == 8001
    assert direct_ingress_proxy_port() is None
    import os

    assert "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT" not in os.environ
    assert os.environ["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] == "31000"


def test_direct_ingress_is_refused_where_it_cannot_hold(tmp_path, monkeypatch, capsys):
    """``serve.run --direct-ingress`` needs a new local Ray (the flag is read when Ray's processes
    start) and one application (its Ingress serves the port): a clear usage error otherwise."""
    import pytest
    import yaml

    from serve.run import main

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump({"http_options": {"port": 8000}, "applications": [{"name": "a", "import_path": "x:y"}]}))
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump({"applications": [{"name": "a", "import_path": "x:y"}, {"name": "b", "import_path": "x:z"}]}))
    with pytest.raises(SystemExit) as exc:
        main(["--direct-ingress", "--address", "10.0.0.1:6379", str(one)])
    assert exc.value.code == 2 and "ray start" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--direct-ingress", str(two)])
    assert exc.value.code == 2 and "one application" in capsys.readouterr().err


def test_quiet_ray_is_refused_when_joining_a_cluster(tmp_path, monkeypatch, capsys):
    """``serve.run --quiet-ray`` sets rates Ray's processes read when they start: joining a running
    cluster would silently change nothing, so it is a usage error naming where they go instead."""
    import pytest
    import yaml

    from serve.run import main

    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump({"http_options": {"port": 8000}, "applications": [{"name": "a", "import_path": "x:y"}]}))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    with pytest.raises(SystemExit) as exc:
        main(["--quiet-ray", str(one)])
    assert exc.value.code == 2 and "ray start" in capsys.readouterr().err


def test_the_quiet_rates_leave_a_variable_the_user_set(monkeypatch):
    from cluster.local import QUIET_RAY_ENV, quiet_ray_env

    for k in QUIET_RAY_ENV:
        monkeypatch.delenv(k, raising=False)
    assert quiet_ray_env() == QUIET_RAY_ENV
    assert QUIET_RAY_ENV["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "1"
    monkeypatch.setenv("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.1")
    env = quiet_ray_env()
    assert "RAY_SERVE_CONTROL_LOOP_INTERVAL_S" not in env and len(env) == len(QUIET_RAY_ENV) - 1
