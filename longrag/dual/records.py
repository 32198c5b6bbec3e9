"""The records of a dual-perspective run: the trace of one stage (calls, tokens, latency, notes),
the filter's judgement of one chunk, and the result of one strategy on one question.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from longrag.dual.rerank import RetrievedChunk
from longrag.llm.base import ChatResult


@dataclass
class StageTrace:
    """One stage: the model that ran it, LLM calls, summed tokens and call latency, the stage's wall
    time, notes."""

    stage: str
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_ms: float = 0.0
    wall_ms: float = 0.0
    notes: list[str] = field(default_factory=list)
    model: str | None = None

    def add(self, r: ChatResult) -> None:
        self.model = r.model
        self.calls += 1
        self.prompt_tokens += r.prompt_tokens
        self.completion_tokens += r.completion_tokens
        self.llm_ms += r.latency_ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Judgement:
    """The filter's verdict on one chunk: ``keep`` None = the reply could not be parsed."""

    chunk_id: int
    keep: bool | None
    reply: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DualResult:
    question: str
    strategy: str
    answer: str
    retrieved: list[RetrievedChunk]
    kept_chunk_ids: list[int]
    paragraph_ids: list[str]
    global_information: str | None
    cot: str | None
    judgements: list[Judgement]
    generator_input_tokens: int
    retrieval: dict[str, Any] | None
    stages: list[StageTrace]
    notes: list[str]
    total_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "strategy": self.strategy,
            "answer": self.answer,
            "retrieved": [c.to_dict() for c in self.retrieved],
            "kept_chunk_ids": self.kept_chunk_ids,
            "paragraph_ids": self.paragraph_ids,
            "global_information": self.global_information,
            "cot": self.cot,
            "judgements": [j.to_dict() for j in self.judgements],
            "trace": {
                "retrieval": self.retrieval,
                "stages": [s.to_dict() for s in self.stages],
                "generator_input_tokens": self.generator_input_tokens,
                "notes": self.notes,
                "total_ms": self.total_ms,
            },
        }
