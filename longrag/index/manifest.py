"""The build manifest: what an index build holds and where it came from (README, Architecture:
"Artifacts, not pickles").

``manifest.json`` sits at the root of a build in the artifact store. It names the embedding model
and dimension, the metric and FAISS factory, the unit kind, the counts, every shard with the sha256
and size of each of its files, the config, and the provenance (git commit, host, library versions,
command line). ``status`` is ``"building"`` until every shard is written, then ``"complete"``.

``plan`` records, per shard, a digest of the units it is to hold (:func:`shard_plan`), so an
interrupted build can be resumed shard by shard: a resume recomputes the plan from the corpus and
config and keeps only shards whose plan and files (sha256) still match.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import platform
import secrets
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileEntry(_Model):
    sha256: str
    bytes: int = Field(ge=0)


class ShardEntry(_Model):
    shard_id: int = Field(ge=0)
    n_units: int = Field(ge=0)
    n_chunks: int = Field(ge=0)
    files: dict[str, FileEntry]


class EmbeddingInfo(_Model):
    model: str
    dim: int = Field(gt=0)
    max_seq_length: int | None = None
    query_instruction: str | None = None
    document_instruction: str | None = None
    normalize: bool = True


class Counts(_Model):
    documents: int = Field(0, ge=0)
    units: int = Field(0, ge=0)
    chunks: int = Field(0, ge=0)


class Provenance(_Model):
    git_commit: str | None = None
    hostname: str | None = None
    platform: str | None = None
    python: str | None = None
    versions: dict[str, str | None] = Field(default_factory=dict)
    command: list[str] = Field(default_factory=list)


class CorpusPart(_Model):
    key: str
    rows: int = Field(ge=0)
    sha256: str
    bytes: int = Field(ge=0)


class CorpusArtifact(_Model):
    """The parsed documents of a build (``documents/part-*.parquet``: doc_id, title, text, links,
    n_tokens) and where they came from. Absent in builds made from documents held in memory."""

    sources: list[str]
    fmt: str
    text_mode: str
    read_tasks: int = Field(ge=0)
    documents: int = Field(ge=0)
    parts: list[CorpusPart] = Field(default_factory=list)


class ParentBuild(_Model):
    """Where an incremental update (``jobs.update``) came from, and what it changed."""

    build_id: str
    uri: str
    changes: dict[str, int] = Field(default_factory=dict)  # documents added / changed / deleted / unchanged
    units: dict[str, int] = Field(default_factory=dict)  # units new / removed / regrouped
    shards_rebuilt: list[int] = Field(default_factory=list)
    shards_reused: list[int] = Field(default_factory=list)


class DimensionMismatch(ValueError):
    """A query encoder whose vectors have another dimension than a build's (a search would fail on shapes)."""


class Manifest(_Model):
    schema_version: int = SCHEMA_VERSION
    build_id: str
    created_at: str
    status: Literal["building", "complete"] = "building"
    embedding: EmbeddingInfo
    metric: Literal["ip", "l2"]
    factory: str
    unit_kind: str
    counts: Counts = Field(default_factory=Counts)
    shards: list[ShardEntry] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    provenance: Provenance = Field(default_factory=Provenance)
    plan: dict[str, str] = Field(default_factory=dict)  # shard id -> digest of its units (resume)
    corpus: CorpusArtifact | None = None  # the parsed-documents artifact (distributed builds)
    artifacts: dict[str, FileEntry] = Field(default_factory=dict)  # build-level files (documents.parquet)
    parent: ParentBuild | None = None  # set by an incremental update: the build it was derived from

    @classmethod
    def create(
        cls,
        config: Any,
        *,
        dim: int,
        max_seq_length: int | None = None,
        query_instruction: str | None = None,
        document_instruction: str | None = None,
        build_id: str | None = None,
        documents: int = 0,
        argv: list[str] | None = None,
    ) -> Manifest:
        """A ``building`` manifest for a :class:`longrag.config.LongRAGConfig` (or its dump)."""
        cfg = config.model_dump(mode="json") if hasattr(config, "model_dump") else dict(config)
        emb, idx, units = cfg["embedding"], cfg["index"], cfg["units"]
        return cls(
            build_id=build_id or new_build_id(),
            created_at=utc_now(),
            embedding=EmbeddingInfo(
                model=emb["model"],
                dim=dim,
                max_seq_length=max_seq_length if max_seq_length is not None else emb.get("max_seq_length"),
                query_instruction=query_instruction,
                document_instruction=document_instruction,
                normalize=emb.get("normalize", True),
            ),
            metric=idx["metric"],
            factory=idx["factory"],
            unit_kind=units["kind"],
            counts=Counts(documents=documents),
            config=cfg,
            provenance=collect_provenance(argv),
        )

    def check_query_dim(self, dim: int, encoder: str = "the query encoder") -> None:
        """Raise :class:`DimensionMismatch` unless query vectors of ``dim`` can search this build
        (``encoder`` names them in the message, e.g. the serving config's model and ``embedding.dim``)."""
        if int(dim) != self.embedding.dim:
            cut = (self.config.get("embedding") or {}).get("dim")
            raise DimensionMismatch(
                f"{encoder} makes {int(dim)}-dimensional vectors, but build {self.build_id} holds "
                f"{self.embedding.dim}-dimensional ones (embedded with {self.embedding.model}"
                f"{f', embedding.dim={cut}' if cut else ''}): serve it with the build's own embedding settings "
                f"(embedding.model={self.embedding.model}, embedding.dim={cut or 'unset'}) or rebuild the index")

    def shard(self, shard_id: int) -> ShardEntry:
        for entry in self.shards:
            if entry.shard_id == shard_id:
                return entry
        raise KeyError(f"build {self.build_id} has no shard {shard_id} (shards: {self.shard_ids})")

    @property
    def shard_ids(self) -> list[int]:
        return [entry.shard_id for entry in self.shards]

    def add_shard(self, entry: ShardEntry) -> None:
        """Add or replace the entry for ``entry.shard_id`` (kept sorted by shard id)."""
        self.shards = sorted([s for s in self.shards if s.shard_id != entry.shard_id] + [entry], key=lambda s: s.shard_id)

    def mark_complete(self) -> None:
        """Set the unit/chunk counts from the shards and flip the status to ``complete``."""
        if not self.shards:
            raise ValueError(f"build {self.build_id} has no shards; refusing to mark it complete")
        self.counts = Counts(
            documents=self.counts.documents,
            units=sum(s.n_units for s in self.shards),
            chunks=sum(s.n_chunks for s in self.shards),
        )
        self.status = "complete"

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        return cls.model_validate_json(text)


def shard_plan(units_by_shard: dict[int, list[Any]]) -> dict[str, str]:
    """Shard id (as a string, JSON keys) -> sha256 over its units (id, documents, titles, token count,
    text), in order. Units are :class:`longrag.types.Unit`.
    """
    plan: dict[str, str] = {}
    for shard_id in sorted(units_by_shard):
        h = hashlib.sha256()
        for u in units_by_shard[shard_id]:
            text = u.text.encode("utf-8")
            head = "\0".join([u.unit_id, "\x1f".join(u.doc_ids), "\x1f".join(u.titles), str(u.n_tokens), str(len(text))])
            h.update(head.encode("utf-8") + b"\0")
            h.update(text)
        plan[str(shard_id)] = h.hexdigest()
    return plan


def new_build_id() -> str:
    """Sortable unique id: UTC timestamp plus random hex, e.g. ``20250101T120000Z-1a2b3c``."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_commit(start: str | Path | None = None) -> str | None:
    """The commit checked out in the repository holding ``start`` (``git rev-parse HEAD``); None
    outside a repository, before its first commit, or where git is not installed (an installed
    package, a container image): provenance never fails a build."""
    here = Path(start or Path(__file__).resolve().parent).resolve()
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--verify", "--quiet", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def _module_version(module: str) -> str | None:
    mod = sys.modules.get(module)
    if mod is None:
        try:
            mod = __import__(module)
        except Exception:  # noqa: BLE001 - provenance must never fail a build
            return None
    return getattr(mod, "__version__", None)


def collect_provenance(argv: list[str] | None = None) -> Provenance:
    """Git commit, host, Python and library versions, and the command line of this process."""
    from longrag import __version__

    versions: dict[str, str | None] = {"longrag": __version__, "faiss": _module_version("faiss")}
    versions.update(
        {name: _version(name) for name in ("numpy", "torch", "sentence-transformers", "transformers", "pyarrow")}
    )
    return Provenance(
        git_commit=git_commit(),
        hostname=socket.gethostname(),
        platform=platform.platform(),
        python=sys.version.split()[0],
        versions=versions,
        command=list(sys.argv if argv is None else argv),
    )
