"""Records that flow through the pipeline.

The records of a build (documents, units, chunks, hits) are plain dataclasses so the core stays
cheap to use; ``to_row``/``from_row`` convert to the flat dicts that Ray Data batches and parquet
files hold. The records of a search that cross the serving layers (:class:`Coverage`,
:class:`RetrievedUnit`, :class:`Retrieval`) are pydantic models: the shard actors, the Serve
deployments and the HTTP schemas (``serve/schemas.py``) all use these one definitions, and they
pass through Ray as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field, computed_field
from pydantic.json_schema import SkipJsonSchema


class LLMError(RuntimeError):
    """Any failure of an LLM backend: unreachable server, HTTP error, context overflow, bad or missing
    model (here, below :mod:`longrag.llm` and :mod:`longrag.models`, which both raise it)."""


class InvalidRequest(ValueError):
    """What a caller asked for is refused (an empty document, an unknown strategy, a question the
    encoder cannot take): the request's fault, an HTTP 4xx, never retried. Every other exception,
    a plain ``ValueError`` included (a misconfiguration, a decoding error), is the server's."""


if TYPE_CHECKING:
    import numpy as np


class DenseEncoder(Protocol):
    """What encodes texts into L2-normalised float32 rows, passages and queries each with their own
    prompt (``longrag.index.embedding.Embedder`` is one; MixPR's hybrid retriever and the dual
    reranker take any)."""

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray: ...


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
    def from_row(cls, row: dict[str, Any]) -> Document:
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
    #: For one question: ``(start, end, score)`` of each of the unit's chunks inside ``text`` (its
    #: MaxP chunk scores, scored on the shard; ``retrieval.document_order=packed``). The reader then
    #: packs its budget with the best paragraphs (:mod:`longrag.reading.packing`). Never stored.
    chunk_scores: list[tuple[int, int, float]] | None = field(default=None, compare=False, repr=False)

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        del row["chunk_scores"]
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Unit:
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
    def from_row(cls, row: dict[str, Any]) -> Chunk:
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
    found_by: str | None = None  # "dense", "bm25", "dense+bm25" (longrag.index.fusion) or "graph" (longrag.index.graph)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ShardRedundancy(BaseModel):
    """The replicas of one shard that are live (answered their last call or ping) of those configured."""

    shard: int
    live: int = Field(description="Replica actors of this shard that answered their last call or ping.")
    replicas: int = Field(description="Replica actors configured (index.replicas).")


def describe_redundancy(rows: list[ShardRedundancy]) -> str:
    """``"shard 0: 2 of 2 replicas; shard 1: 1 of 2 replicas"`` (one wording for /healthz and coverage)."""
    return "; ".join(f"shard {r.shard}: {r.live} of {r.replicas} replicas" for r in rows)


class Coverage(BaseModel):
    """How much of a sharded index answered one search. A shard none of whose replicas answered is
    named in ``errors`` (with the last replica's error) and makes the result ``degraded``; it is
    never dropped silently. So does a shard whose winning units could not be fetched from it after
    the search (``fetch_errors``, the units in ``unfetched``: they come without text). A shard that
    answered from fewer live replicas than configured (a replica dead, restarting or being
    re-created) shows in ``replicas`` and makes ``redundancy_degraded`` true: full results, less
    redundancy."""

    shards: int = Field(description="Shards of the build.")
    answered: int = Field(description="Shards that answered (one replica each).")
    errors: dict[int, str] = Field(
        default_factory=dict, description="Shard -> why no replica of it answered (JSON keys are strings)."
    )
    failovers: int = Field(0, description="Replica calls that failed and were retried on another replica of the shard.")
    replicas: list[ShardRedundancy] = Field(
        default_factory=list, description="Live replicas per shard as this search knew them (a replica is "
        "not live from a failed call until it answers again); empty: not tracked.",
    )

    fetch_errors: dict[int, str] = Field(
        default_factory=dict, description="Shard -> why the units it won could not be fetched from it after the "
        "search (the winners-only fetch above index.fused_fetch_max_units; JSON keys are strings).",
    )
    unfetched: list[str] = Field(
        default_factory=list, description="The result's units whose records could not be fetched (their shard is "
        "in fetch_errors): ranked, without titles or text.",
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="Whether some shard did not answer (answered < shards), or the units some shard won could not "
        "be fetched (fetch_errors).")
    @property
    def degraded(self) -> bool:
        return self.answered < self.shards or bool(self.fetch_errors)

    @computed_field(description="The shards that did not answer, ascending.")  # type: ignore[prop-decorator]
    @property
    def failed_shards(self) -> list[int]:
        return sorted(self.errors)

    @computed_field(description="Whether some shard has fewer live replicas than configured.")  # type: ignore[prop-decorator]
    @property
    def redundancy_degraded(self) -> bool:
        return any(r.live < r.replicas for r in self.replicas)

    @computed_field(description='Live replicas per shard in words, e.g. "shard 0: 2 of 2 replicas; '  # type: ignore[prop-decorator]
                    'shard 1: 1 of 2 replicas" (empty: not tracked).')
    @property
    def redundancy(self) -> str:
        return describe_redundancy(self.replicas)

    def with_fetch_errors(self, fetch_errors: dict[int, str], unfetched: list[str]) -> Coverage:
        """This coverage with the shards whose units could not be fetched, and those units, added."""
        if not fetch_errors and not unfetched:
            return self
        units = [*self.unfetched, *(u for u in unfetched if u not in self.unfetched)]
        return self.model_copy(update={"fetch_errors": {**self.fetch_errors, **fetch_errors}, "unfetched": units})

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class RetrievedUnit(BaseModel):
    """One retrieved unit: its hit (MaxP score, owning shard, best chunk) and the unit's record.

    ``text`` is the whole unit, for the reader inside the application: it is excluded from
    serialization and from the HTTP schema (``/v1/retrieve`` returns the best chunk, not the unit).
    ``text is None`` means the unit's record could not be fetched from its shard."""

    unit_id: str
    titles: list[str] = Field(default_factory=list)
    doc_ids: list[str] = Field(default_factory=list)
    score: float
    shard: int
    best_chunk_id: str
    best_chunk: str | None = Field(None, description="Text of the unit's best-scoring chunk.")
    n_tokens: int = 0
    doc_scores: list[float | None] | None = Field(
        None, description="Each document's best chunk score, in ``doc_ids`` order, when the documents were put "
        "best first (retrieval.document_order=evidence or packed); None: the stored order.")
    found_by: str | None = Field(
        None, description="Which search found the unit: 'dense', 'bm25' or 'dense+bm25' (retrieval.mode=hybrid); "
        "'graph' (only the walk over the unit link graph reached it: retrieval.mode=graph or hybrid+graph); "
        "'hop 1' (the question), 'hop 2: <bridge>' ... (retrieval.mode=iterative); None: the one dense search.")
    text: SkipJsonSchema[str | None] = Field(None, exclude=True, repr=False)
    chunk_scores: SkipJsonSchema[list[tuple[int, int, float]] | None] = Field(
        None, exclude=True, repr=False, description="(start, end, score) of the unit's chunks in ``text`` for "
        "this question (retrieval.document_order=packed): what the reader packs its budget by.")

    @classmethod
    def from_hit(cls, hit: UnitHit, row: Mapping[str, Any] | None) -> RetrievedUnit:
        """A hit joined with its unit row (``Unit.to_row()`` plus ``best_chunk_text``); ``row``
        None: the unit could not be fetched (no titles, no text)."""
        if row is None:
            return cls(unit_id=hit.unit_id, score=hit.score, shard=hit.shard, best_chunk_id=hit.best_chunk_id,
                       found_by=hit.found_by)
        return cls(  # a unit the graph walk found has its best chunk picked by its shard (row["best_chunk_id"])
            unit_id=hit.unit_id, score=hit.score, shard=hit.shard, found_by=hit.found_by,
            best_chunk_id=row.get("best_chunk_id") or hit.best_chunk_id,
            titles=list(row["titles"]), doc_ids=list(row["doc_ids"]), n_tokens=int(row["n_tokens"]),
            best_chunk=row.get("best_chunk_text"), text=str(row["text"]), doc_scores=row.get("doc_scores"),
            chunk_scores=[(int(a), int(b), float(c)) for a, b, c in row["chunk_scores"]]
            if row.get("chunk_scores") is not None else None,
        )

    def to_unit(self) -> Unit:
        if self.text is None:
            raise ValueError(f"unit {self.unit_id!r} was not fetched (no text)")
        return Unit(unit_id=self.unit_id, doc_ids=self.doc_ids, titles=self.titles, text=self.text,
                    n_tokens=self.n_tokens, chunk_scores=self.chunk_scores)


class Retrieval(BaseModel):
    """One question's search over a sharded index: ranked units, coverage, and where the time went."""

    units: list[RetrievedUnit]
    coverage: Coverage
    trace: dict[str, Any] = Field(default_factory=dict)

    def readable(self) -> list[Unit]:
        """The units a reader can take (fetched ones), in rank order."""
        return [u.to_unit() for u in self.units if u.text is not None]
