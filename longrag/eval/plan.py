"""The plan of an evaluation run (pure core, no Ray): its typed config, the settings it compares,
where each setting's index lives and when an existing build can be reused (the fingerprint), and
where reader answers are checkpointed.

An evaluation compares retrieval (and the reader) across unit granularities and link sources
(LongRAG, Jiang et al., 2024, "LongRAG: Enhancing Retrieval-Augmented Generation with Long-context
LLMs", Section 4.2, Tables 1-2, and Section 4.3, Figures 3-5). :class:`EvalConfig` is what the
``jobs.evaluate`` command line fills in; :class:`EvalRun` adds the product config and the command.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from longrag.config import LinkSource, LongRAGConfig
from longrag.index.plan import BuildSettings

FINGERPRINT_VERSION = 1
FINGERPRINT_FILE = "eval_fingerprint.json"

DATASET_FORMATS = {"hotpotqa": "hotpotqa", "musique": "musique", "2wiki": "2wiki", "nq": "nq_open", "longbench": "longbench"}
LINK_METHODS = {"titles": "title_mentions", "tfidf": "tfidf", "both": "both"}
UNIT_KINDS = ("grouped", "document", "passage")
LINK_SOURCES = ("hyperlinks", *LINK_METHODS)
LINKER_VERSIONS = {"tfidf": "tfidf/hashed", "both": "both/tfidf-hashed"}
"""What the fingerprint records for a computed linker whose implementation changed (the TF-IDF links
of the index package replaced the fitted-vocabulary ones): an index built with the old links is
rebuilt, not reused."""

Dataset = Literal["hotpotqa", "musique", "2wiki", "nq", "longbench"]
UnitKind = Literal["grouped", "document", "passage"]
Pipeline = Literal["retrieve", "longrag"]
"""``retrieve``: retrieval only; ``longrag``: retrieval, then the long reader over the top
``reader_k`` units (LongRAG, Section 3.2)."""


class EvalConfig(BaseModel):
    """One evaluation: the questions, the corpus, the settings to compare and how to run them."""

    model_config = ConfigDict(extra="forbid")

    dataset: Dataset
    data: str = Field(description="QA file (JSON/JSONL) of the dataset")
    corpus: str | None = Field(None, description="corpus file instead of the pooled paragraphs")
    pool: Literal["all", "selected"] | int = Field(
        "all", description="pool the paragraphs of all questions, of the evaluated ones, or of the first N")
    units: list[UnitKind] = Field(default_factory=lambda: ["grouped"], min_length=1)
    links: list[LinkSource] = Field(default_factory=lambda: ["titles"], min_length=1)
    ks: list[int] = Field(default_factory=lambda: [1, 2, 4, 8], min_length=1)
    token_budgets: list[int] = Field(
        default_factory=lambda: [260, 650, 1024], min_length=1,
        description="Paragraph recall inside the first B tokens of the ranked units (embedding tokenizer): 260 and "
        "650 are the top 2 and top 5 100-word passages (HippoRAG's R@2 / R@5 at equal context), 1024 the reader's "
        "default budget.")
    pipeline: Pipeline = "retrieve"
    reader_k: int = Field(4, ge=1)
    reader_concurrency: int = Field(1, ge=1)
    limit: int | None = Field(None, ge=1)
    out: str
    index_dir: str = "artifacts/eval-index"
    rebuild_index: bool = False
    endpoint: str | None = None
    http_timeout: float = Field(300.0, gt=0)
    encode: Literal["auto", "driver", "ray-data"] = "auto"
    answer_recall_all_types: bool = False
    progress: bool = True

    @field_validator("ks", "token_budgets")
    @classmethod
    def _ks(cls, ks: list[int]) -> list[int]:
        if any(k < 1 for k in ks):
            raise ValueError(f"k values must be positive integers, got {ks}")
        return sorted(set(ks))

    @field_validator("pool")
    @classmethod
    def _pool(cls, pool: str | int) -> str | int:
        if isinstance(pool, int) and pool < 1:
            raise ValueError(f"pool takes all, selected or a positive integer, not {pool!r}")
        return pool

    @property
    def reads(self) -> bool:
        """Whether a reader runs after retrieval."""
        return self.pipeline == "longrag"

    def k_max(self) -> int:
        """Units to retrieve per question: the deepest k scored, or the reader's k when deeper."""
        return max(max(self.ks), self.reader_k if self.reads else 1)

    def settings(self) -> list[EvalSetting]:
        return settings_of(self.units, self.links)

    def report_dict(self) -> dict[str, Any]:
        """The ``eval`` part of the config recorded in every report."""
        return {
            "dataset": self.dataset, "data": self.data, "corpus": self.corpus, "pool": self.pool,
            "units": list(self.units), "links": list(self.links), "k": list(self.ks), "pipeline": self.pipeline,
            "token_budgets": list(self.token_budgets), "reader_k": self.reader_k, "limit": self.limit,
            "endpoint": self.endpoint, "encode": self.encode,
            "answer_recall_all_types": self.answer_recall_all_types,
        }


class EvalRun(BaseModel):
    """An evaluation as run: its :class:`EvalConfig`, the product config and the command line."""

    model_config = ConfigDict(extra="forbid")

    eval: EvalConfig
    config: LongRAGConfig = Field(default_factory=LongRAGConfig)
    command: list[str] = Field(default_factory=list)

    def report_config(self) -> dict[str, Any]:
        return {"longrag": self.config.model_dump(), "eval": self.eval.report_dict()}

    def config_for(self, unit: str) -> LongRAGConfig:
        """The product config of one setting (its unit kind)."""
        cfg = self.config.model_copy(deep=True)
        cfg.units.kind = unit
        return cfg


class EvalSetting(BaseModel):
    """One compared setting: a unit kind, its link source, and the label naming what varies."""

    model_config = ConfigDict(frozen=True)

    unit: UnitKind
    links: LinkSource
    label: str


def settings_of(units: Sequence[str], links: Sequence[str]) -> list[EvalSetting]:
    """One setting per unit kind (and per link source for grouped units: only grouping reads links);
    labels name what varies."""
    out = []
    for unit in dict.fromkeys(units):
        for ln in links if unit == "grouped" else links[:1]:
            label = f"{unit}-{ln}" if unit == "grouped" and len(links) > 1 else unit
            out.append(EvalSetting(unit=unit, links=ln, label=label))
    return out


# ------------------------------------------------------------------------------------------ fingerprint
def file_digest(path: str | Path, chunk_bytes: int = 1 << 20) -> dict[str, Any]:
    """``{"path", "sha256", "bytes"}`` of a file (read in chunks)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"not a file: {p}")
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        while block := fh.read(chunk_bytes):
            h.update(block)
    return {"path": str(p), "sha256": h.hexdigest(), "bytes": p.stat().st_size}


def index_fingerprint(
    corpus_files: Sequence[Mapping[str, Any]],
    settings: BuildSettings,
    *,
    links: str,
    extra: Mapping[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Fingerprint of an evaluation's index build: the corpus files' content (sha256 + size, not
    their paths), the link source (ignored unless units are grouped: only grouping reads links), the
    :class:`~longrag.index.plan.BuildSettings` (the same ones a resume checks) and ``extra``.

    Returns ``(hex digest, the parts hashed)``; equal digests mean an existing build can be reused.
    """
    unit = settings.units.kind
    if links not in LINK_SOURCES:
        raise ValueError(f"links must be one of {', '.join(LINK_SOURCES)}, got {links!r}")
    parts = {
        "version": FINGERPRINT_VERSION,
        "corpus": [{"sha256": f["sha256"], "bytes": int(f["bytes"])} for f in corpus_files],
        "unit": unit,
        "links": LINKER_VERSIONS.get(links, links) if unit == "grouped" else "n/a",
        **settings.as_dict(),
        "extra": dict(extra or {}),
    }
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest(), parts


def index_uri(index_root: str, dataset: str, setting: EvalSetting, fingerprint: str) -> str:
    """Where the index of one setting lives under ``index_root`` (local folder or ``s3://``)."""
    link_tag = setting.links if setting.unit == "grouped" else "nolinks"
    return f"{index_root.rstrip('/')}/{dataset}-{setting.unit}-{link_tag}-{fingerprint[:12]}"


# ------------------------------------------------------------------------------------------ reader checkpoints
def reader_setup(config: LongRAGConfig, reader_k: int) -> dict[str, Any]:
    """What decides a local reader's answers (the key of its checkpoint entries): the model, the
    reader, how many units and what of them it reads (the units' document order, or packed)."""
    return {"llm": config.llm.model_dump(), "reader": config.reader.model_dump(), "reader_k": reader_k,
            "document_order": config.retrieval.document_order}


def checkpoint_file(out: str | Path, label: str) -> Path:
    """Where a setting's reader answers are checkpointed while its run is in progress."""
    return Path(out) / f".reader-checkpoint-{label}.jsonl"
