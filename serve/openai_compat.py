"""The OpenAI-compatible face of the ingress: ``POST /v1/chat/completions`` and ``GET /v1/models``.

Models: ``longrag`` (retrieval over the index, then the two-turn long reader) and ``longrag-dual``
(the dual-perspective pipeline, ``strategy`` in an extra field; available only where the app has
a dual pipeline, see :func:`route_model`). The last user message is the question; the reply's
``message.content`` is the short answer; ``longrag`` (an extra field) carries the long answer,
the evidence, the coverage and the per-stage trace. Extra request fields (the ``openai`` client's
``extra_body``): ``k``, ``compression``, ``strategy``.

Streaming (``stream: true``): server-sent events of ``chat.completion.chunk`` objects, ending with
``data: [DONE]``. The long answer (the reader's first turn) streams as it is generated, in
``delta.reasoning_content`` (the field vLLM streams a reasoning model's thinking in); the short
answer (the second turn, cleaned before it is shown) follows in ``delta.content``; the last chunk
has ``finish_reason: "stop"`` and the ``longrag`` extra field.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from longrag.config import DualStrategy, RetrievalMode
from longrag.types import InvalidRequest
from serve.schemas import Coverage, Evidence, check_encodable

MODELS: dict[str, str] = {
    "longrag": "MaxP retrieval over the sharded index, then the two-turn long reader (LongRAG, Jiang et al., 2024).",
    "longrag-dual": "The dual-perspective pipeline (Zhao et al., 2024); pick the strategy with the extra field "
    "'strategy'.",
}
CREATED = 1_700_000_000  # a fixed "created" for the model list


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text: a string, or the ``text`` parts of a content list."""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content or [] if p.get("type") == "text")


class ChatCompletionRequest(BaseModel):
    """The fields of OpenAI's chat completion request this API reads; sampling fields are accepted
    and ignored (the reader's decoding is configured, greedy by default); unknown fields: 422."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="longrag or longrag-dual (GET /v1/models).")
    messages: list[ChatMessage] = Field(min_length=1, description="The last user message is the question.")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    k: StrictInt | None = Field(None, ge=1, description="Units to retrieve (1..serve.max_k); default serve.default_k.")
    compression: Literal["truncate", "mixpr"] | None = None
    strategy: DualStrategy | None = Field(None, description="longrag-dual only: R&B, R&L, Ext, Fil or E&F.")
    mode: RetrievalMode | None = Field(
        None, description="Retrieval mode (as /v1/retrieve's): dense, hybrid, graph, hybrid+graph or iterative; "
        "default retrieval.mode.",
    )
    # Accepted for compatibility, not used:
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: Literal[1] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None

    @field_validator("messages")
    @classmethod
    def _encodable(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        for i, m in enumerate(messages):
            check_encodable(m.text(), f"messages[{i}].content")
        return messages

    def question(self) -> str:
        """The last user message's text (ValueError when there is none or it is blank)."""
        for m in reversed(self.messages):
            if m.role == "user":
                text = m.text().strip()
                if not text:
                    raise InvalidRequest("the last user message is empty")
                return text
        raise InvalidRequest("messages hold no user message (the last one is the question)")


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    finish_reason: Literal["stop"] = "stop"


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class LongRAGExtra(BaseModel):
    """What a chat reply carries besides the answer."""

    long_answer: str
    evidence: list[Evidence]
    coverage: Coverage
    trace: dict[str, Any]
    strategy: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    longrag: LongRAGExtra


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = CREATED
    owned_by: str = "longrag"
    description: str = ""
    available: bool = Field(True, description="False: this deployment cannot serve it (requests get 404).")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def model_list(dual_available: bool) -> ModelList:
    return ModelList(data=[ModelCard(id=name, description=text, available=name != "longrag-dual" or dual_available)
                           for name, text in MODELS.items()])


class ModelNotAvailable(ValueError):
    """The model is unknown, or known but not deployed here (the ingress answers 404)."""


def route_model(model: str, dual_available: bool) -> Literal["longrag", "longrag-dual"]:
    """Which pipeline serves ``model``. The one place that decides it: the dual-perspective
    deployments plug in here (``Ingress(dual=...)``)."""
    if model not in MODELS:
        raise ModelNotAvailable(f"model {model!r} does not exist; the models are {sorted(MODELS)}")
    if model == "longrag-dual" and not dual_available:
        raise ModelNotAvailable("model 'longrag-dual' is not available in this deployment (it has no "
                                "dual-perspective pipeline); use model 'longrag'")
    return model  # type: ignore[return-value]


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def chunk(cid: str, model: str, created: int, delta: dict[str, Any], finish: str | None = None,
          **extra: Any) -> str:
    """One ``chat.completion.chunk`` as a server-sent event."""
    body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return data(body)


def data(payload: Any) -> str:
    """One unnamed server-sent event (the chat stream's events)."""
    return f"data: {json.dumps(payload)}\n\n"


DONE = "data: [DONE]\n\n"


def sse(event: str, data: Any) -> str:
    """One named server-sent event with a JSON payload (``/v1/answer`` streams these)."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def now() -> int:
    return int(time.time())
