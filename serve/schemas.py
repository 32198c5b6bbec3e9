"""HTTP request/response models (they are the OpenAPI schema at /docs and /openapi.json)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RetrieveRequest(_Strict):
    question: str = Field(..., description="The question; non-empty, at most serve.max_question_chars characters.")
    k: int | None = Field(None, description="Number of units to return (1..serve.max_k); default serve.default_k.")


class AnswerRequest(RetrieveRequest):
    compression: Literal["truncate", "mixpr"] | None = Field(
        None,
        description="When the units exceed the reader's window: trim (truncate) or select sentences with "
        "question-seeded MixPR (mixpr). Default: reader.compression.",
    )


class Coverage(BaseModel):
    shards: int
    answered: int
    degraded: bool
    failed_shards: list[int] = []
    errors: dict[str, str] = {}
    failovers: int = 0


class RetrievedUnit(BaseModel):
    unit_id: str
    titles: list[str]
    doc_ids: list[str]
    score: float
    shard: int
    best_chunk_id: str
    best_chunk: str | None = None
    n_tokens: int


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
    long_answer: str
    evidence: list[Evidence]
    coverage: Coverage
    trace: dict[str, Any]


class Health(BaseModel):
    status: str
    build_id: str
    shards: int
    units: int
    chunks: int
    embedding_model: str
    llm: str
