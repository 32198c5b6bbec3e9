"""Records that flow through the pipeline.

They are plain dataclasses so the core stays cheap to use; ``to_row``/``from_row`` convert to the
flat dicts that Ray Data batches and parquet files hold.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Document:
    """One source document. ``links`` holds the titles of the documents it links to (already
    resolved through redirects when the source has them); links to titles outside the corpus are
    kept here and dropped when the link graph is built."""

    doc_id: str
    title: str
    text: str
    links: list[str] = field(default_factory=list)

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Document":
        return cls(
            doc_id=str(row["doc_id"]),
            title=str(row["title"]),
            text=str(row["text"]),
            links=list(row.get("links") or []),
        )


@dataclass
class Unit:
    """A retrieval unit: one passage, one document, or a group of related documents."""

    unit_id: str
    doc_ids: list[str]
    titles: list[str]
    text: str
    n_tokens: int

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Unit":
        return cls(
            unit_id=str(row["unit_id"]),
            doc_ids=list(row["doc_ids"]),
            titles=list(row["titles"]),
            text=str(row["text"]),
            n_tokens=int(row["n_tokens"]),
        )


@dataclass
class Chunk:
    """A piece of a unit small enough for the embedding model (never silently truncated)."""

    chunk_id: str
    unit_id: str
    position: int
    text: str
    n_tokens: int

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Chunk":
        return cls(
            chunk_id=str(row["chunk_id"]),
            unit_id=str(row["unit_id"]),
            position=int(row["position"]),
            text=str(row["text"]),
            n_tokens=int(row["n_tokens"]),
        )


@dataclass
class UnitHit:
    """One retrieved unit: its MaxP score is the score of its best chunk."""

    unit_id: str
    score: float
    best_chunk_id: str
    shard: int = -1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
