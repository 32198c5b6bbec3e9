"""HTTP request/response models (they are the OpenAPI schema at /docs and /openapi.json).

Requests are strict: unknown fields are refused, ``k`` must be a JSON integer (``"5"`` is not
coerced), and text must be valid Unicode (a lone surrogate such as ``"\\ud800"`` cannot be encoded
and is refused here, at the edge, before it reaches a tokenizer). The numeric limits below are the
limits of the config (``serve.max_question_chars``, ``serve.max_k``) are stated by the Ingress in
the OpenAPI schema it serves (:func:`state_limits`) and enforced by it with the same 422.

Every error response has one shape, :class:`ErrorResponse`:
``{"error": {"code": ..., "message": ..., "detail": ...}}``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

# The records of a search are the core's: one definition from the shard actors to the HTTP schema.
from longrag.config import DualStrategy, RetrievalMode
from longrag.types import Coverage, RetrievedUnit, ShardRedundancy  # noqa: F401  (part of the HTTP schema)

NOT_BLANK = r"\S"  # JSON Schema pattern: at least one non-whitespace character


def check_encodable(value: str, field: str) -> str:
    """Refuse text that cannot be encoded as UTF-8 (lone surrogates from ``\\ud800``-style JSON escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        raise ValueError(
            f"{field} is not valid Unicode text: a lone surrogate \\u{ord(bad):04x} at character {exc.start}"
        ) from None
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RetrieveRequest(_Strict):
    question: str = Field(
        ...,
        min_length=1,
        json_schema_extra={"pattern": NOT_BLANK},
        description="The question: valid Unicode with at least one non-whitespace character, at most "
        "serve.max_question_chars characters (leading/trailing whitespace is stripped).",
    )
    k: StrictInt | None = Field(
        None, ge=1, description="Number of units to return (a JSON integer, 1..serve.max_k); "
        "default serve.default_k."
    )
    mode: RetrievalMode | None = Field(
        None, description="dense: one MaxP search; hybrid: MaxP and BM25 fused by reciprocal rank (each unit's "
        "found_by says which found it); graph / hybrid+graph: the dense / hybrid candidates and the units linked to "
        "the best of them, re-ranked by Personalized PageRank over the unit link graph (found_by 'graph': only the "
        "walk reached it); iterative: up to retrieval.max_hops searches, each next one "
        "with the bridge entity a short LLM call names from the evidence so far (trace.hops shows them). "
        "Default retrieval.mode.",
    )

    @field_validator("question", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        if isinstance(v, str):  # before the type check, so a lone surrogate gets this message
            check_encodable(v, "question")
            if v and not v.strip():
                raise ValueError("question is empty (no non-whitespace character)")
        return v


STRATEGY_DESCRIPTION = (
    "Dual-perspective LongRAG (Zhao et al., 2024, Section 5.3): R&B (chunks), R&L (their source paragraphs), "
    "Ext (extractor's global information + chunks), Fil (CoT-filtered chunks), E&F (both). The trace shows every "
    "stage's model, calls, tokens and latency, the kept chunks and the generator's input tokens."
)


class AnswerRequest(RetrieveRequest):
    stream: bool = Field(
        False, description="Stream server-sent events: retrieval (units, coverage), answer (the short answer, "
        "as soon as it is ready), token (the long answer as the reader writes it), trace (the whole answer).",
    )
    long_answer: bool | None = Field(
        None, description="Write the long answer too (a few sentences after the short answer; a second LLM call "
        "that reuses the documents' prefix). Default: reader.long_answer. false: one LLM call, the response comes "
        "as soon as the short answer is ready. The two_turn reader always writes it.",
    )
    compression: Literal["truncate", "mixpr"] | None = Field(
        None,
        description="When the units exceed the reader's window: trim (truncate) or select sentences with "
        "question-seeded MixPR (mixpr). Default: reader.compression.",
    )
    strategy: DualStrategy | None = Field(
        None, description="Answer the retrieved units with this dual-perspective strategy instead of the "
        "two-turn reader. " + STRATEGY_DESCRIPTION,
    )


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code: invalid_request, unauthorized, not_found, "
                      "model_not_found, method_not_allowed, payload_too_large, too_many_requests, unavailable, "
                      "timeout, internal_error, or http_<status>.")
    message: str = Field(description="One human-readable sentence.")
    detail: Any = Field(None, description="Per-problem messages (a list for invalid_request), or context "
                        "such as the coverage of a failed retrieval, or the stage of a timeout (504) or of a "
                        "failure (503): {stage, timeout_s | attempts, errors}.")


class ErrorResponse(BaseModel):
    """The one shape of every 4xx/5xx response the application produces."""

    error: ErrorBody


class RetrieveResponse(BaseModel):
    question: str
    k: int
    units: list[RetrievedUnit]
    coverage: Coverage
    trace: dict[str, Any]


class Evidence(BaseModel):
    unit_id: str
    titles: list[str]
    score: float
    used: bool = Field(description="Whether the unit went into the reader's context.")


class AnswerResponse(BaseModel):
    question: str
    answer: str
    long_answer: str = Field(description="The reader's first-turn answer (empty with a strategy).")
    evidence: list[Evidence]
    coverage: Coverage
    trace: dict[str, Any] = Field(description="Stage timings; with a strategy, trace.dual has every stage's model, "
                                  "calls, tokens and latency, the kept chunks and generator_input_tokens.")
    strategy: DualStrategy | None = Field(None, description="The dual strategy that answered, if any.")


class DeploymentHealth(BaseModel):
    status: str = Field(description="Serve's deployment status (HEALTHY, UPDATING, UPSCALING, UNHEALTHY, ...).")
    running_replicas: int
    message: str = Field("", description="Serve's explanation, e.g. the resources a replica waits for.")
    missing_resources: dict[str, float] | None = Field(
        None, description="What a pending replica asks for beyond the cluster's free resources (None: nothing missing)."
    )


class IndexDescription(BaseModel):
    """What the ``Retriever`` serves: the build and the live replicas of each shard."""

    build_id: str
    shards: int
    units: int
    chunks: int
    embedding_model: str
    index: list[ShardRedundancy]


class LLMDescription(BaseModel):
    """The ``LLMServer``'s engine: its name and the context window it really has."""

    name: str
    context_window: int
    in_flight: int = Field(0, description="Calls this replica is running now (chat, completion, stream, JSON).")
    cancelled: int = Field(0, description="Calls cancelled before they finished (the caller went away or ran out "
                           "of time), since the replica started.")
    engine_cancelled: dict[str, int] = Field(
        default_factory=dict, description="The engine's own count where it has one (llama.cpp: calls refused while "
        "waiting, aborted while running, and the tokens generated for them).")


class Health(BaseModel):
    status: Literal["ok", "degraded", "unavailable"] = Field(
        description="ok: every deployment healthy and every shard fully replicated; degraded: this ingress "
        "answers but something in the cluster is missing (a replica, a shard without a live replica: its "
        "results are degraded, a deployment unhealthy or pending, e.g. the LLM); unavailable (HTTP 503, not "
        "ready): this ingress cannot answer (its query encoder has no running replica, or no build is loaded)."
    )
    build_id: str | None = None
    shards: int | None = None
    units: int | None = None
    chunks: int | None = None
    embedding_model: str | None = None
    llm: str | None = None
    index: list[ShardRedundancy] = Field(default_factory=list, description="Live replicas per shard.")
    redundancy: str = Field("", description='e.g. "shard 0: 1 of 2 replicas; shard 1: 2 of 2 replicas".')
    deployments: dict[str, DeploymentHealth] = Field(
        default_factory=dict, description="Every deployment of the app that is not HEALTHY (with Serve's message)."
    )
    problems: list[str] = Field(default_factory=list, description="One line per problem found.")
    limits: dict[str, int] = Field(default_factory=dict, description="max_question_chars, max_k, default_k.")
    age_s: float = Field(0.0, description="Seconds since this report was built (at most serve.readyz_cache_s).")
    described_age_s: float | None = Field(
        None, description="Set when the Retriever's describe timed out (a slow Serve controller): the build, shards "
        "and replica counts are then those of its last answer, this many seconds older than the report (stale), "
        "and problems says so. None: the Retriever described them for this report.")


class Liveness(BaseModel):
    status: Literal["ok"] = Field(description="The ingress replica answers; nothing behind it was asked.")
    app: str | None = Field(None, description="The Serve application.")


def state_limits(schema: dict[str, Any], *, max_question_chars: int, max_k: int, max_document_bytes: int) -> dict[str, Any]:
    """Write the limits a running app enforces into its OpenAPI schema (in place; returned).

    The models carry the structural rules (types, non-empty, ``k >= 1``); the numeric upper limits
    come from the app's config, so they are stated here, where the served schema is built."""
    components = schema.get("components", {}).get("schemas", {})
    for name in ("RetrieveRequest", "AnswerRequest", "LongContextRequest", "ChatCompletionRequest"):
        props = components.get(name, {}).get("properties", {})
        question = props.get("question")
        if question is not None:
            pattern = question.pop("pattern", None) if "anyOf" in question else None
            for option in question.get("anyOf", [question]):  # LongContextRequest.question is optional
                if option.get("type") == "string":
                    option["maxLength"] = max_question_chars
                    if pattern:
                        option["pattern"] = pattern
        k = props.get("k")
        if k is not None and name != "LongContextRequest":
            for option in k.get("anyOf", [k]):
                if option.get("type") == "integer":
                    option["maximum"] = max_k
        document = props.get("document")
        if document is not None:
            # JSON Schema cannot bound bytes; UTF-8 has at least one byte per character, so this
            # maxLength is a bound every accepted document meets. Over the byte limit: 413.
            document["maxLength"] = max_document_bytes
            document["x-max-bytes"] = max_document_bytes
    return schema
