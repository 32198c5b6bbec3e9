"""Autoscaling, exercised: ``python -m jobs.autoscale_demo`` for real, reduced (a shorter burst).

On the fake multinode cluster built from ``cluster/aws.yaml``'s node types (Ray's own autoscaler,
its fake node provider: each node a raylet on this machine), the job runs ``jobs.index`` on the
bundled sample, then the Serve app of ``serve/configs/cpu-cluster.yaml`` with replica autoscaling delays of
seconds, a burst of ``/v1/retrieve`` and ``/v1/answer`` on 127.0.0.1 during which the node holding
shard replicas is killed, and the scale-down after it. The figures come from the job's one JSON
line: nodes launched for pending work, the build's manifest complete, nodes removed once idle, the
app healthy with every shard actor on an ``index_cpu`` node, replicas grown under the burst and
back to their minimum after it, no failed request, full coverage back after the kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# In `make test-scenarios` (~3 min here): the one test that sees nodes and replicas grow and shrink.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.scenario, pytest.mark.ray("a")]

ROOT = Path(__file__).resolve().parents[2]
PORT = 8421


def test_index_and_serve_scale_nodes_and_replicas_up_and_down(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = tmp_path / "autoscale.log"
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.autoscale_demo", "--out", str(tmp_path / "build"), "--png",
         str(tmp_path / "timeline.png"), "--log", str(log), "--requests", "240", "--burst-s", "90",
         "--port", str(PORT)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )
    lines = proc.stdout.strip().splitlines()
    tail = log.read_text()[-4000:] if log.exists() else proc.stderr[-4000:]
    assert lines, (proc.returncode, tail)
    fig = json.loads(lines[-1])
    assert fig["job"] == "autoscale_demo" and fig["error"] is None, (fig, tail)

    # the index job: nodes launched for its pending work, the build complete, the nodes gone once idle
    assert fig["index_first_node_s"] is not None and fig["index_nodes"].get("cpu", 0) >= 1, fig
    assert fig["index_nodes"].get("gpu_l4", 0) >= 1, fig  # embedding.num_gpus=1: the GPU type launched
    # the pool sized from the 2 GPUs the cluster can grow to, not from the 0 GPUs up when it started
    pool = fig["embedding_pool"]
    assert "2 actor(s)" in pool and "2 GPUs (the autoscaler's node types at max_workers" in pool, pool
    assert pool.endswith("0 GPUs)"), pool
    assert fig["manifest_complete"] is True and fig["index_scale_down_s"] is not None, fig

    # the Serve app: healthy, every shard actor on an index node the autoscaler launched for it
    assert fig["time_to_healthy_s"] is not None and fig["serve_first_node_s"] is not None, fig
    assert fig["shard_node_types"] == ["index_cpu"] * 4, fig

    # the burst: deployments grew and shrank back, no request failed, the killed node replaced
    assert fig["requests"] > 0 and fig["requests_failed"] == 0 and fig["server_errors"] == 0, fig
    assert any(fig["replicas"][d][1] > 1 for d in ("QueryEncoder", "Retriever", "Reader")), fig
    assert all(fig["replicas_at_end"][d] == 1 for d in ("QueryEncoder", "Retriever", "Reader")), fig
    assert fig["time_to_scale_down_s"] is not None, fig
    assert fig["killed_node_type"] == "index_cpu" and fig["kill_to_full_coverage_s"] is not None, fig
    assert fig["healthy_at_end"] is True and (tmp_path / "timeline.png").stat().st_size > 10_000, fig
    assert fig["passed"] is True and proc.returncode == 0, fig
