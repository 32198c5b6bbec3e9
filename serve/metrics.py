"""Prometheus metrics of the ingress through ``ray.util.metrics`` (Ray exports them on each node's
metrics port, ``ray start --metrics-export-port``, with a ``ray_`` prefix):

* ``longrag_requests`` (counter; ``route``, ``status``): every HTTP request answered;
* ``longrag_errors`` (counter; ``route``, ``status``): those answered with a 4xx or 5xx;
* ``longrag_stage_latency_ms`` (histogram; ``stage``: encode, retrieve, read, total);
* ``longrag_llm_tokens`` (counter; ``kind``: prompt, completion): the reader's tokens;
* ``longrag_shed_requests`` (counter; ``route``): reader requests refused at the door (503 + Retry-After,
  ``serve.max_reader_requests``);
* ``longrag_cancelled_requests`` (counter; ``route``): reader requests cancelled before they were
  answered (the client went away, or the request's deadline passed);
* ``longrag_degraded_responses`` (counter): retrievals some shard did not answer (or whose winning
  units some shard could not send: ``coverage.fetch_errors``);
* ``longrag_shard_failovers`` (counter): replica calls retried on another replica of the shard;
* ``longrag_shard_live_replicas`` (gauge; ``shard``): live replicas of each shard of the build served,
  as the last ``/readyz`` report found them (0: the shard's results are degraded);
* ``longrag_deployments_not_healthy`` (gauge): deployments of the app not HEALTHY or without a running
  replica in that report;
* ``longrag_ready`` (gauge): 1 when that report found this ingress ready (``/readyz`` 200), else 0.

The gauges are the cluster's state, which ``/readyz`` keeps out of its status code (:mod:`serve.routes.health`).
"""

from __future__ import annotations

from typing import Any

LATENCY_BOUNDARIES_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000]
ROUTES = ("/v1/retrieve", "/v1/answer", "/v1/longcontext", "/v1/chat/completions", "/v1/models", "/livez", "/readyz",
          "/healthz")


class AppMetrics:
    """Created in the ingress replica (Ray metrics belong to the process that records them)."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge, Histogram

        self.requests = Counter("longrag_requests", "HTTP requests answered, by route and status.",
                                tag_keys=("route", "status"))
        self.errors = Counter("longrag_errors", "HTTP requests answered with a 4xx or 5xx, by route and status.",
                              tag_keys=("route", "status"))
        self.latency = Histogram("longrag_stage_latency_ms", "Latency of a request's stages in milliseconds.",
                                 boundaries=LATENCY_BOUNDARIES_MS, tag_keys=("stage",))
        self.tokens = Counter("longrag_llm_tokens", "Reader LLM tokens, by kind (prompt, completion).",
                              tag_keys=("kind",))
        self.shed_requests = Counter("longrag_shed_requests", "Reader requests refused at the door (503 + "
                                     "Retry-After), by route.", tag_keys=("route",))
        self.cancelled_requests = Counter("longrag_cancelled_requests", "Reader requests cancelled before their "
                                          "answer (client gone or deadline passed), by route.", tag_keys=("route",))
        self.degraded = Counter("longrag_degraded_responses", "Retrievals that some shard did not answer.")
        self.failovers = Counter("longrag_shard_failovers", "Shard replica calls retried on another replica.")
        self.shard_live = Gauge("longrag_shard_live_replicas", "Live replicas of each shard (last /readyz report).",
                                tag_keys=("shard",))
        self.not_healthy = Gauge("longrag_deployments_not_healthy",
                                 "Deployments not HEALTHY or without a running replica (last /readyz report).")
        self.ready = Gauge("longrag_ready", "1 when the last /readyz report found this ingress ready, else 0.")

    def request(self, path: str, status: int) -> None:
        tags = {"route": path if path in ROUTES else "other", "status": str(status)}
        self.requests.inc(1, tags)
        if status >= 400:
            self.errors.inc(1, tags)

    def shed(self, path: str) -> None:
        self.shed_requests.inc(1, {"route": path if path in ROUTES else "other"})

    def cancelled(self, path: str) -> None:
        self.cancelled_requests.inc(1, {"route": path if path in ROUTES else "other"})

    def stages(self, trace: dict[str, Any]) -> None:
        for stage in ("encode", "retrieve", "read", "total"):
            value = trace.get(f"{stage}_ms")
            if isinstance(value, (int, float)):
                self.latency.observe(float(value), {"stage": stage})

    def retrieval(self, coverage: Any) -> None:
        if coverage.degraded:
            self.degraded.inc(1)
        if coverage.failovers:
            self.failovers.inc(coverage.failovers)

    def health(self, report: Any) -> None:
        """The cluster's state from a readiness report (:class:`serve.schemas.Health`)."""
        for row in report.index:
            self.shard_live.set(row.live, {"shard": str(row.shard)})
        self.not_healthy.set(len(report.deployments))
        self.ready.set(0 if report.status == "unavailable" else 1)

    def llm_tokens(self, prompt: int, completion: int) -> None:
        if prompt:
            self.tokens.inc(prompt, {"kind": "prompt"})
        if completion:
            self.tokens.inc(completion, {"kind": "completion"})
