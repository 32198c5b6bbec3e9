"""Typed records of the LRGinstruction build: its configuration, the pre-processed samples, the
teacher's requests and replies, the instruction records it writes and the build report.

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Section 3.2 and Appendix C.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

KINDS: tuple[str, ...] = ("extractor", "cot", "filter", "task")
"""The four data kinds of LRGinstruction (Appendix C): long-context extractor data, CoT-guidance
data, filtering data and task-oriented data."""

Kind = Literal["extractor", "cot", "filter", "task"]
Step = Literal["generate", "evaluate"]
Split = Literal["train", "heldout"]

#: Appendix C.1: a question is kept only when all its paragraphs together reach this many tokens
#: (1.5k for HotpotQA and 2WikiMultiHopQA, 2.5k for MuSiQue; QASPER is not filtered).
PAPER_MIN_CONTEXT_TOKENS: dict[str, int] = {"hotpotqa": 1500, "2wiki": 1500, "musique": 2500}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LRGConfig(_Model):
    """How LRGinstruction is built (defaults follow the paper's Appendix C where it says)."""

    min_context_tokens: dict[str, int] = Field(
        default_factory=lambda: dict(PAPER_MIN_CONTEXT_TOKENS),
        description="Per source format: drop a question whose paragraphs total fewer tokens (Appendix C.1).",
    )
    default_min_context_tokens: int = Field(0, ge=0, description="For formats not in min_context_tokens.")
    distractors: Literal["balanced", "random"] = Field(
        "balanced",
        description="balanced: as many distracting paragraphs as supporting ones, so each makes half of P "
        "(Section 3.2); random: a uniform count in [2, all distractors] (Appendix C.1).",
    )
    min_output_tokens: int = Field(
        20, ge=0, description="A teacher extractor output or CoT shorter than this is discarded (Appendix C.2, C.3)."
    )
    kinds: tuple[Kind, ...] = Field(KINDS, description="Which data kinds to build.")
    heldout_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="Share of questions in the held-out split.")
    balance_filter: bool = Field(
        True, description="Per question, as many False as True filtering records (Appendix C.3: 100 + 100)."
    )
    generate_max_tokens: int = Field(256, gt=0, description="Tokens the teacher may write for an extractor output or CoT.")
    evaluate_max_tokens: int = Field(24, gt=0, description="Tokens of one self-evaluation verdict (JSON).")
    temperature: float = Field(0.0, ge=0.0)
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> LRGConfig:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ValueError(f"kinds {list(self.kinds)!r}: choose one or more of {', '.join(KINDS)}")
        return self

    def min_tokens_for(self, fmt: str) -> int:
        return self.min_context_tokens.get(fmt, self.default_min_context_tokens)


class SourceParagraph(_Model):
    title: str
    text: str
    supporting: bool

    def titled(self) -> str:
        return f"{self.title}\n{self.text}" if self.title else self.text


class Sample(_Model):
    """One pre-processed question: ``paragraphs`` is P, all supporting paragraphs P_s plus the
    sampled distracting ones P_d, in a seeded shuffled order (Section 3.2)."""

    sample_id: str  # "<source>:<qid>", unique across input files
    source: str  # the input file's name
    format: str
    qid: str
    question: str
    answer: str
    paragraphs: list[SourceParagraph]
    context_tokens: int  # all the question's paragraphs before sampling (the C.1 rule)

    @property
    def supporting(self) -> list[SourceParagraph]:
        return [p for p in self.paragraphs if p.supporting]

    @property
    def distracting(self) -> list[SourceParagraph]:
        return [p for p in self.paragraphs if not p.supporting]


class Message(_Model):
    role: Literal["system", "user", "assistant"]
    content: str


class TeacherRequest(_Model):
    """One teacher call. ``id`` is ``<sample_id>|<kind>|<step>``; ``prompt_sha`` fingerprints the
    messages, so a journaled reply is reused only for the very same prompt."""

    id: str
    sample_id: str
    kind: Kind
    step: Step
    messages: list[Message]
    max_tokens: int
    json_status: bool = False  # constrain the reply to {"status": bool}
    prompt_sha: str


class TeacherReply(_Model):
    """The teacher's answer to one request, or the error that ended it (never dropped)."""

    id: str
    prompt_sha: str
    text: str = ""
    error: str | None = None
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class Provenance(_Model):
    teacher: str | None  # None: no teacher output in the record (filtering gold and task data come from labels)
    prompts_sha: str
    source: str
    question_id: str
    paragraph_titles: list[str]
    self_evaluation: str | None = None  # the verdict that admitted the teacher output


class InstructionRecord(_Model):
    """One LRGinstruction sample in the chat ``messages`` format that TRL's SFTTrainer and
    LLaMA-Factory (sharegpt, OpenAI-style tags) read, with its kind, split and provenance."""

    id: str
    kind: Kind
    split: Split
    messages: list[Message]
    provenance: Provenance


def trained_question_ids(data: str | Path) -> set[str]:
    """The source question ids of the training split of an LRGinstruction build (``data`` is the
    build folder or its ``train.jsonl``): an evaluation of a model tuned on it leaves them out."""
    path = Path(data)
    if path.is_dir():
        path = path / "train.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no LRGinstruction train.jsonl (the output folder of jobs.lrg_instruct)")
    with open(path, encoding="utf-8") as fh:
        return {InstructionRecord.model_validate_json(line).provenance.question_id for line in fh if line.strip()}


class Outcome(_Model):
    """Why a candidate did not become a record: ``rejected`` by a rule or the self-evaluator, or an
    ``error`` of the teacher call."""

    sample_id: str
    kind: Kind
    status: Literal["rejected", "error"]
    reason: str


class KindCounts(_Model):
    candidates: int = 0
    kept: int = 0
    rejected: dict[str, int] = Field(default_factory=dict)
    errors: int = 0

    @property
    def kept_ratio(self) -> float | None:
        return round(self.kept / self.candidates, 4) if self.candidates else None


class BuildReport(_Model):
    teacher: str
    prompts_sha: str
    config: LRGConfig
    sources: list[dict]
    questions_loaded: int
    questions_dropped: dict[str, int]
    questions_kept: int
    paragraphs: dict[str, int]  # supporting / distracting in the kept samples' P
    teacher_requests: int
    teacher_replies_reused: int  # from the journal of an earlier run (resume)
    teacher_errors: int
    teacher_error_examples: list[str]
    kinds: dict[str, KindCounts]
    records: dict[str, int]  # per split
    kept_ratio: float | None  # kept / candidates over the teacher-judged kinds (extractor, CoT)
    wall_s: float
