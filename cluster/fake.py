"""An autoscaling cluster on one machine: Ray's real autoscaler with its fake multinode provider,
the worker node types of ``cluster/aws.yaml`` (scaled down: :func:`cluster.node_types.scaled_node_types`).

The head (0 CPUs, as a production head) runs the GCS and the autoscaler (``monitor.py``) with an
autoscaling config built from ``cluster/fake_multinode.yaml`` and ``cluster/aws.yaml``; for pending
work the autoscaler starts a "node" — a raylet with the node type's resources — on this machine,
and stops it once it has been idle ``idle_timeout_minutes``. What runs on the cluster (``jobs.index``,
the Serve app) is the same code as on ``ray up cluster/aws.yaml``: nothing in the product knows the
provider is fake.

Ray's ``AutoscalingCluster`` does the same, but it reads a base config its wheel does not ship and
starts and stops with ``ray stop --force``, which would stop every Ray on the machine; this one
stops exactly the processes of its own session.

    with start_fake_cluster() as fake:       # connected: ray.init(address=fake.address)
        ...                                  # submit work; nodes come and go
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from cluster import ray_private
from cluster.node_types import AWS_YAML, load, publish_cluster_config, scaled_node_types
from longrag import scoped

log = logging.getLogger(__name__)

BASE_YAML = Path(__file__).resolve().parent / "fake_multinode.yaml"
#: How many nodes of each type may be up at once here (2 cores): enough to see every type scale.
DEFAULT_MAX_WORKERS = {"cpu": 2, "index_cpu": 1, "gpu_l4": 2}


FakeMultiNodeProvider = ray_private.fake_provider()


class FakeProvider(FakeMultiNodeProvider):
    """Ray's fake multinode provider, whose node types may declare ``memory`` as aws.yaml's have it
    (on AWS Ray fills it in from the instance type): the autoscaler packs memory asks (a shard actor's,
    ``index.shard_memory_factor``) by it. Ray's provider passes a type's resources to the node as
    custom resources, where ``memory`` is refused, so it is left out there: the node's raylet
    detects its memory itself, as on a real machine."""

    def create_node_with_resources_and_labels(self, node_config, tags, count, resources, labels):
        resources = {k: v for k, v in resources.items() if k != "memory"}
        return super().create_node_with_resources_and_labels(node_config, tags, count, resources, labels)


def fake_config(gcs_address: str, *, aws_yaml: str | Path = AWS_YAML, base_yaml: str | Path = BASE_YAML,
                max_workers: dict[str, int] | None = None, idle_timeout_minutes: float | None = None,
                object_store_bytes: int = 128 * 2**20) -> dict[str, Any]:
    """The autoscaling config of the fake cluster: ``base_yaml`` with the worker node types of
    ``aws_yaml`` (scaled down) and the provider pointed at the head's GCS."""
    config = copy.deepcopy(load(base_yaml))
    caps = {**DEFAULT_MAX_WORKERS, **(max_workers or {})}
    workers = scaled_node_types(load(aws_yaml), max_workers=caps, object_store_bytes=object_store_bytes)
    config["available_node_types"].update(workers)
    config["max_workers"] = sum(t["max_workers"] for t in workers.values())
    config["provider"]["gcs_address"] = gcs_address
    if idle_timeout_minutes is not None:
        config["idle_timeout_minutes"] = idle_timeout_minutes
    return config


def stop_processes(procs: list[psutil.Process], timeout_s: float) -> None:
    """SIGTERM ``procs``, then SIGKILL those still alive after ``timeout_s``; gone ones are skipped."""
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@dataclass
class FakeCluster:
    """A started fake multinode cluster; ``shutdown()`` stops its head and every node it launched."""

    address: str
    config: dict[str, Any]
    session_dir: str
    head: Any  # ray.cluster_utils.Cluster holding the head node
    config_path: str
    handle: Any = None  # cluster.local.ClusterHandle of this driver's connection
    killed: list[str] = field(default_factory=list)

    def _raylets(self) -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if cmd and os.path.basename(cmd[0]) == "raylet" and any(self.session_dir in a for a in cmd):
                out.append(p)
        return out

    def _session_processes(self) -> list[psutil.Process]:
        """Every process of this cluster's session but this one (raylets and their children, agents,
        log monitors: each names the session folder in its command line)."""
        out = {}
        for p in psutil.process_iter(["cmdline"]):
            if p.pid != os.getpid() and any(self.session_dir in a for a in p.info["cmdline"] or []):
                out[p.pid] = p
                for c in p.children(recursive=True):
                    out[c.pid] = c
        return list(out.values())

    def node_pid(self, node_id: str) -> int | None:
        """The raylet of a node of this cluster (the fake provider's node process)."""
        for p in self._raylets():
            if any(a == f"--node_id={node_id}" for a in p.info["cmdline"]):
                return p.pid
        return None

    def kill_node(self, node_id: str) -> int:
        """SIGKILL a worker node's raylet and its workers, as a lost machine: Ray sees the node die
        and the autoscaler replaces it. Returns the raylet's pid."""
        if node_id == self.head.head_node.node_id:
            raise ValueError("kill_node kills worker nodes, not the head")
        pid = self.node_pid(node_id)
        if pid is None:
            raise LookupError(f"no raylet of node {node_id} in session {self.session_dir}")
        proc = psutil.Process(pid)
        for p in [*proc.children(recursive=True), proc]:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.killed.append(node_id)
        log.warning("killed node %s (raylet pid %d)", node_id, pid)
        return pid

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        # the nodes the autoscaler started (their raylets, workers, agents and log monitors), then the head
        head_pids = {info.process.pid for infos in self.head.head_node.all_processes.values() for info in infos}
        stop_processes([p for p in self._session_processes() if p.pid not in head_pids], timeout_s=10)
        self.head.shutdown()
        Path(self.config_path).unlink(missing_ok=True)

    def __enter__(self) -> FakeCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def start_fake_cluster(*, aws_yaml: str | Path = AWS_YAML, max_workers: dict[str, int] | None = None,
                       idle_timeout_minutes: float | None = None, connect: bool = True,
                       head_object_store_bytes: int = 128 * 2**20, update_interval_s: int = 1) -> FakeCluster:
    """Start the head with the autoscaler on the fake provider; with ``connect``, connect this driver
    (``cluster.local.start_or_join``: the project's worker environment) and publish the node types
    (:func:`cluster.node_types.publish_cluster_config`), as ``cluster/aws.yaml``'s head does."""
    import ray
    from ray.cluster_utils import Cluster

    ip = ray.util.get_node_ip_address()
    port = _free_port()
    config = fake_config(f"{ip}:{port}", aws_yaml=aws_yaml, max_workers=max_workers,
                         idle_timeout_minutes=idle_timeout_minutes)
    fd, path = tempfile.mkstemp(prefix="longrag-fake-cluster-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f)
    # the autoscaler (a process of the head) inherits these: the fake provider requires the first,
    # and the autoscaler imports cluster.fake.FakeProvider from this repository
    root = str(Path(__file__).resolve().parent.parent)
    env = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": str(update_interval_s),
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    try:
        with scoped.environ(env):  # restored after
            head = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 0, "num_gpus": 0, "gcs_server_port": port, "autoscaling_config": path,
                "include_dashboard": False, "object_store_memory": head_object_store_bytes})
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise
    fake = FakeCluster(address=head.address, config=config, session_dir=head.head_node.get_session_dir_path(),
                       head=head, config_path=path)
    log.info("fake multinode cluster at %s in %.1f s; node types %s", fake.address, time.monotonic() - t0,
             {n: t["resources"] for n, t in config["available_node_types"].items()})
    if connect:
        from cluster.local import start_or_join

        try:
            fake.handle = start_or_join(fake.address)
            publish_cluster_config(config)
        except BaseException:
            fake.shutdown()
            raise
    return fake
