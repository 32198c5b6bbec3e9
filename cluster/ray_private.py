"""Ray's private APIs this project uses, each wrapped here once, where no public API does the job.
Checked against Ray :data:`CHECKED_RAY`; ``tests/cluster/test_ray_private.py`` resolves every one
of them and fails loudly on another Ray, so an upgrade re-checks them before anything else breaks.

* :func:`serve_start`: Serve started with a deploy schema's HTTP/gRPC/proxy options and controller
  options, to submit that schema without the dashboard (``serve deploy`` posts it to the
  dashboard's REST API, off here) — ``ray.serve._private.api.serve_start``;
* :func:`serve_run_nowait`: ``serve.run`` that returns once the application is submitted, not
  once it runs (``serve.run`` waits for it, forever when a replica cannot be placed; the caller
  then waits with a deadline and reports why) — ``ray.serve.api._run(..., _blocking=False)``;
* :func:`serve_delete_nowait`: ``serve.delete`` that returns once the deletion is submitted, not
  once the application is gone (the index holder registry deletes from inside its one-at-a-time
  calls, which must not wait for Serve to drain replicas) — ``serve.delete(name, _blocking=False)``;
* :func:`deploy_apps_nowait`: a deploy schema submitted to Serve's controller without waiting for
  its applications to run (``serve deploy``'s behaviour; the caller waits with a deadline) —
  ``ServeControllerClient.deploy_apps(schema, _blocking=False)``
  (``ray.serve._private.client``);
* :func:`max_resources_from_cluster_config`: what an autoscaling cluster can grow to, as Ray Data
  reads it — ``ray._private.state.state.get_max_resources_from_cluster_config``;
* :func:`put_autoscaler_cluster_config`: writes that config (node groups, as the protobuf message
  ``ray.core.generated.autoscaler_pb2.ClusterConfig``) to the GCS key it is read from (Ray's
  open-source autoscaler does not) — ``ray.experimental.internal_kv._internal_kv_put`` with
  ``ray._raylet.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY`` / ``GCS_AUTOSCALER_STATE_NAMESPACE``;
* :func:`autoscaler_cluster_status`: the autoscaler's view of the nodes (active, idle, by node
  type) — ``ray.autoscaler.v2.sdk.get_cluster_status``;
* :func:`serve_details`: Serve's details of every application (replicas' states and nodes,
  per-replica ``required_resources``) without the dashboard's REST API —
  ``ray.serve.context._get_global_client().get_serve_details()``;
* :func:`serve_request_id`: the id Serve gave the request a replica is handling —
  ``ray.serve.context._get_serve_request_context``;
* :func:`actor_table`: every actor with its state and node, without the dashboard the state API
  (``ray.util.state.list_actors``) needs — ``ray._private.state.state.actor_table``;
* :func:`fake_provider`: the fake multi-node provider the real autoscaler drives on one machine
  (``ray.cluster_utils.AutoscalingCluster`` uses it too) —
  ``ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider``.
"""

from __future__ import annotations

from typing import Any

#: The Ray these wrappers were checked against (pyproject pins it).
CHECKED_RAY = "2.60.0"

#: (module, attribute) of every private name used here: the upgrade test imports each.
PRIVATE_NAMES = (
    ("ray.serve._private.api", "serve_start"),
    ("ray.serve.api", "_run"),
    ("ray._private.state", "state"),
    ("ray.experimental.internal_kv", "_internal_kv_put"),
    ("ray._raylet", "GCS_AUTOSCALER_CLUSTER_CONFIG_KEY"),
    ("ray._raylet", "GCS_AUTOSCALER_STATE_NAMESPACE"),
    ("ray.autoscaler._private.fake_multi_node.node_provider", "FakeMultiNodeProvider"),
    ("ray.core.generated.autoscaler_pb2", "ClusterConfig"),
    ("ray.autoscaler.v2.sdk", "get_cluster_status"),
    ("ray.serve.context", "_get_global_client"),
    ("ray.serve.context", "_get_serve_request_context"),
    ("ray.serve._private.client", "ServeControllerClient"),
)

#: (module, callable, keyword) of every private keyword argument passed here to a public or
#: private callable: the upgrade test checks each callable still takes it.
PRIVATE_KEYWORDS = (
    ("ray.serve.api", "_run", "_blocking"),
    ("ray.serve.api", "delete", "_blocking"),
    ("ray.serve._private.client", "ServeControllerClient.deploy_apps", "_blocking"),
)


def serve_start(*, http_options: dict[str, Any], proxy_location: Any, grpc_options: Any,
                controller_options: Any) -> Any:
    """Start (or reach) Serve with these options; returns Serve's client (``deploy_apps``)."""
    from ray.serve._private import api

    return api.serve_start(http_options=http_options, proxy_location=proxy_location, grpc_options=grpc_options,
                           controller_options=controller_options)


def serve_run_nowait(app: Any, *, name: str, route_prefix: str | None) -> None:
    """Submit ``app`` imperatively as ``serve.run`` does, without waiting for it to run."""
    from ray.serve import api

    api._run(app, _blocking=False, name=name, route_prefix=route_prefix)


def serve_delete_nowait(name: str) -> None:
    """Submit the deletion of the Serve application ``name`` without waiting for it to be gone."""
    from ray import serve

    serve.delete(name, _blocking=False)


def deploy_apps_nowait(client: Any, schema: Any) -> None:
    """Submit ``schema`` (a ``ServeDeploySchema``) through ``client`` (:func:`serve_start`'s) without
    waiting for its applications to run."""
    client.deploy_apps(schema, _blocking=False)


def max_resources_from_cluster_config() -> dict[str, float] | None:
    """The autoscaler's node types at their maximum counts, summed (None without a published config)."""
    import ray

    return ray._private.state.state.get_max_resources_from_cluster_config()


def put_autoscaler_cluster_config(node_groups: list[dict[str, Any]]) -> None:
    """Write the autoscaler's cluster config where :func:`max_resources_from_cluster_config` reads
    it: one ``ClusterConfig`` node group per ``{"name", "min_count", "max_count", "resources":
    {resource: integer amount}}``."""
    import ray
    from ray.core.generated import autoscaler_pb2
    from ray.experimental.internal_kv import _internal_kv_put

    msg = autoscaler_pb2.ClusterConfig()
    for g in node_groups:
        group = msg.node_group_configs.add()
        group.name, group.min_count, group.max_count = g["name"], int(g["min_count"]), int(g["max_count"])
        for key, value in g["resources"].items():
            group.resources[key] = int(value)
    _internal_kv_put(ray._raylet.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY.encode(), msg.SerializeToString(), overwrite=True,
                     namespace=ray._raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode())


def autoscaler_cluster_status(address: str) -> Any:
    """The autoscaler's cluster status (``active_nodes``, ``idle_nodes``: ``node_id``,
    ``ray_node_type_name``) from the GCS at ``address``."""
    from ray.autoscaler.v2.sdk import get_cluster_status

    return get_cluster_status(address)


def serve_details() -> dict[str, Any]:
    """Serve's details (``ServeInstanceDetails`` as a dict: ``applications`` with each deployment's
    replicas and ``required_resources``); empty when no Serve controller runs."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    return client.get_serve_details() if client else {}


def serve_request_id() -> str:
    """The request id of the request this Serve replica is handling (raises outside a replica)."""
    from ray.serve.context import _get_serve_request_context

    return _get_serve_request_context().request_id


def actor_table() -> list[dict[str, Any]]:
    """Every actor the GCS knows: ``ActorClassName``, ``State``, ``Address.NodeID``, ..."""
    import ray

    return list(ray._private.state.state.actor_table(None).values())


def fake_provider() -> type:
    """Ray's fake multi-node provider class (imported on first use: it pulls the autoscaler)."""
    from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

    return FakeMultiNodeProvider
