"""Prometheus metrics of the ingress through ``ray.util.metrics`` (Ray exports them on each node's
metrics port, ``ray start --metrics-export-port``, with a ``ray_`` prefix):

* ``longrag_requests`` (counter; ``route``, ``status``): every HTTP request answered;
* ``longrag_errors`` (counter; ``route``, ``status``): those answered with a 4xx or 5xx;
* ``longrag_stage_latency_ms`` (histogram; ``stage``: encode, retrieve, read, total);
* ``longrag_llm_tokens`` (counter; ``kind``: prompt, completion): the reader's tokens;
* ``longrag_degraded_responses`` (counter): retrievals some shard did not answer;
* ``longrag_shard_failovers`` (counter): replica calls retried on another replica of the shard.
"""

from __future__ import annotations

from typing import Any

LATENCY_BOUNDARIES_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000]
ROUTES = ("/v1/retrieve", "/v1/answer", "/v1/longcontext", "/v1/chat/completions", "/v1/models", "/livez", "/readyz",
          "/healthz")


class AppMetrics:
    """Created in the ingress replica (Ray metrics belong to the process that records them)."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Histogram

        self.requests = Counter("longrag_requests", "HTTP requests answered, by route and status.",
                                tag_keys=("route", "status"))
        self.errors = Counter("longrag_errors", "HTTP requests answered with a 4xx or 5xx, by route and status.",
                              tag_keys=("route", "status"))
        self.latency = Histogram("longrag_stage_latency_ms", "Latency of a request's stages in milliseconds.",
                                 boundaries=LATENCY_BOUNDARIES_MS, tag_keys=("stage",))
        self.tokens = Counter("longrag_llm_tokens", "Reader LLM tokens, by kind (prompt, completion).",
                              tag_keys=("kind",))
        self.degraded = Counter("longrag_degraded_responses", "Retrievals that some shard did not answer.")
        self.failovers = Counter("longrag_shard_failovers", "Shard replica calls retried on another replica.")

    def request(self, path: str, status: int) -> None:
        tags = {"route": path if path in ROUTES else "other", "status": str(status)}
        self.requests.inc(1, tags)
        if status >= 400:
            self.errors.inc(1, tags)

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

    def llm_tokens(self, prompt: int, completion: int) -> None:
        if prompt:
            self.tokens.inc(prompt, {"kind": "prompt"})
        if completion:
            self.tokens.inc(completion, {"kind": "completion"})
