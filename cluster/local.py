"""Start or join a Ray cluster with explicit resources.

The same code runs against a laptop and a real cluster:

* ``address`` given (or ``RAY_ADDRESS`` set, as under ``ray job submit``): join that cluster;
* ``nodes == 1``: start a local single-node Ray with the resources asked for;
* ``nodes > 1``: start a simulated multi-node cluster (``ray.cluster_utils.Cluster``), one raylet
  per node on this machine, so placement, spreading and node failure can be exercised locally.

Logical CPUs may exceed physical cores: on a 2-core machine the embedding pool, the read tasks and
the shard actors all need a slot, so the default asks for 4 logical CPUs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import ray

from longrag import scoped
from longrag.cli import OFFLINE_ENV

log = logging.getLogger(__name__)

# Environment every worker gets: offline models, quiet tokenizers, one BLAS thread per worker
# (many workers share few cores; the embedding actors set their own torch threads).
WORKER_ENV = {
    **OFFLINE_ENV,
    "OMP_NUM_THREADS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}

#: The rates of Ray's periodic bookkeeping for one machine whose LLM holds every core, opt-in
#: (``start_or_join(quiet=True)``, ``python -m serve.run --quiet-ray``, ``jobs.demo --quiet-ray``).
#: llama.cpp's threads work in lock step, so any process that takes a core for a moment stalls all of
#: them. Beside the idle demo app Ray's own processes took 0.10 of a core at Ray's rates (Serve's
#: controller 0.030, the GCS 0.014, the dashboard agent 0.008) and 0.05 at these; the demo's time to
#: the short answer did not measurably change (docs/benchmarks.md, "Where the 0.5B's gap goes"), so
#: Ray's own rates stay the default. Read when Ray's processes start; on a cluster they would go in the
#: environment of ``ray start``. A variable already set in the environment wins.
QUIET_RAY_ENV: dict[str, str] = {
    # Serve's controller reconciles every 0.1 s: replica deaths and config changes are acted on within 1 s.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",
    # The dashboard agent's node and process stats (every 5 s: a walk over every process).
    "REPORTER_UPDATE_INTERVAL_MS": "30000",
    # Every Ray process's metrics export.
    "RAY_metrics_report_interval_ms": "60000",
    # Task events (the state API's and the dashboard's task lists) sent to the GCS.
    "RAY_task_events_report_interval_ms": "10000",
    # The raylet's resource reports to the GCS (scheduling on one node does not wait for them).
    "RAY_raylet_report_resources_period_milliseconds": "1000",
}


def quiet_ray_env() -> dict[str, str]:
    """:data:`QUIET_RAY_ENV` less the variables this process's environment already sets."""
    return {k: v for k, v in QUIET_RAY_ENV.items() if k not in os.environ}


# Settings the driver has that workers need too (an S3 endpoint for a local S3-compatible server,
# credentials for it). On a real cluster prefer instance roles / IRSA over forwarded keys.
FORWARDED_ENV_PREFIXES = ("LONGRAG_", "AWS_")


@dataclass
class ClusterHandle:
    """What ``start_or_join`` started; ``shutdown()`` stops only what it started."""

    address: str
    started: bool
    nodes: int
    simulated: Any = None  # ray.cluster_utils.Cluster when simulated
    logs_dir: str | None = None  # Ray's log folder of this session on this node (when known)
    node_handles: list[Any] = field(default_factory=list)
    connected: bool = True  # this call connected the driver (False: it was connected before and stays so)

    def add_node(self, **resources: Any) -> Any:
        """Add one simulated node (only for simulated clusters)."""
        if self.simulated is None:
            raise RuntimeError("add_node() is only available on a simulated multi-node cluster")
        node = self.simulated.add_node(**resources)
        self.node_handles.append(node)
        self.simulated.wait_for_nodes()
        return node

    def remove_node(self, node: Any, graceful: bool = True) -> None:
        """Stop a simulated node; ``graceful=False`` kills its processes at once, as a crashed machine."""
        if self.simulated is None:
            raise RuntimeError("remove_node() is only available on a simulated multi-node cluster")
        self.simulated.remove_node(node, allow_graceful=graceful)
        self.node_handles.remove(node)

    def shutdown(self) -> None:
        if self.connected and ray.is_initialized():
            ray.shutdown()
        if self.simulated is not None:
            self.simulated.shutdown()
            self.simulated = None

    def __enter__(self) -> ClusterHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def start_or_join(
    address: str | None = None,
    *,
    num_cpus: float | None = 4,
    num_gpus: float | None = 0,
    resources: dict[str, float] | None = None,
    nodes: int = 1,
    namespace: str = "longrag",
    object_store_memory: int | None = 512 * 1024**2,
    env_vars: dict[str, str] | None = None,
    include_dashboard: bool = False,
    dashboard_port: int | None = None,
    quiet: bool = False,
) -> ClusterHandle:
    """Connect this driver to a Ray cluster, starting a local one when no address is known.

    ``num_cpus``/``num_gpus``/``resources`` are per node for local clusters (logical GPUs let
    GPU-shaped actors schedule on a CPU machine: the code picks its real device itself).
    ``include_dashboard`` (single node) starts the dashboard, which the state API
    (``ray.util.state``) and job submission need, on ``dashboard_port`` (Ray's default 8265).
    ``quiet`` (a new single-node Ray): Ray's bookkeeping at :data:`QUIET_RAY_ENV`'s rates.
    """
    forwarded = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    runtime_env = {"env_vars": {**WORKER_ENV, **forwarded, **(env_vars or {})}}
    address = address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        ctx = ray.get_runtime_context()
        return ClusterHandle(address=ctx.gcs_address, started=False, nodes=len(ray.nodes()), connected=False)
    if address:
        log.info("joining Ray cluster at %s", address)
        ctx = ray.init(address=address, namespace=namespace, runtime_env=runtime_env, log_to_driver=True)
        return ClusterHandle(address=address, started=False, nodes=len(ray.nodes()), logs_dir=_logs_dir(ctx))

    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    if nodes == 1:
        with scoped.environ(quiet_ray_env() if quiet else {}):  # Ray's processes inherit it at their start
            ctx = ray.init(
                address="local",  # always a new local instance, never another Ray already on this machine
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                resources=resources,
                namespace=namespace,
                include_dashboard=include_dashboard,
                **({"dashboard_port": dashboard_port} if include_dashboard and dashboard_port else {}),
                object_store_memory=object_store_memory,
                runtime_env=runtime_env,
                log_to_driver=True,
            )
        return ClusterHandle(address=ray.get_runtime_context().gcs_address, started=True, nodes=1,
                             logs_dir=_logs_dir(ctx))

    from ray.cluster_utils import Cluster

    node_args = {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": resources or {}}
    if object_store_memory:
        node_args["object_store_memory"] = object_store_memory
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node_args, "include_dashboard": False},
    )
    handles = [cluster.head_node]
    for _ in range(nodes - 1):
        handles.append(cluster.add_node(**node_args))
    cluster.wait_for_nodes()
    ctx = ray.init(address=cluster.address, namespace=namespace, runtime_env=runtime_env)
    log.info("started a simulated %d-node Ray cluster at %s", nodes, cluster.address)
    return ClusterHandle(
        address=cluster.address, started=True, nodes=nodes, simulated=cluster, node_handles=handles,
        logs_dir=_logs_dir(ctx),
    )


def _logs_dir(ctx: Any) -> str | None:
    """``<session_dir>/logs`` of the context ``ray.init`` returned (worker, raylet and Serve logs)."""
    session = getattr(ctx, "address_info", {}).get("session_dir")
    return os.path.join(session, "logs") if session else None
