"""The plan of an index build, without Ray: what decides a build, its units and shards, and whether
an interrupted build can be resumed.

A build is parse -> group -> chunk + embed -> shard -> manifest (README, Architecture). This module
holds every decision of it that needs no cluster; ``actors/build.py`` runs the parallel part (parsing,
chunk + embed, building the shards) with Ray Data from the :class:`BuildPlan` made here.

- :class:`BuildSettings` is the one definition of "what an index build holds": the evaluation's
  index fingerprint (:func:`longrag.eval.plan.index_fingerprint`) and the resume check
  (:func:`resume_decision`) both use it, so a build reused by the evaluation is exactly a build a
  resume would accept.
- :func:`plan_build` groups documents into units (LongRAG, Jiang et al., 2024, Section 3.1,
  Algorithm 1) and assigns them to shards (a unit never spans shards, so MaxP stays shard-local);
  the plan digest (:func:`longrag.index.manifest.shard_plan`) names each shard's units.
- :func:`start_build` / :func:`finish_build` write the ``building`` manifest and the complete one.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from longrag.config import ChunkConfig, EmbeddingConfig, IndexConfig, LongRAGConfig, UnitConfig
from longrag.index.manifest import Manifest, ShardEntry, shard_plan
from longrag.types import Document, Unit

log = logging.getLogger(__name__)


class BuildExistsError(RuntimeError):
    """The output location already holds a build (complete or partial)."""


class ResumeError(RuntimeError):
    """A resume was asked for but cannot be done (no unfinished build, or another config/corpus)."""


# ------------------------------------------------------------------------------------------ settings
class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EmbeddingBuild(_Frozen):
    model: str
    max_seq_length: int | None
    normalize: bool
    # None (the model's own) is left out of as_dict: builds made before the fields keep their fingerprint
    document_instruction: str | None = None
    dim: int | None = None


class UnitsBuild(_Frozen):
    kind: Literal["grouped", "document", "passage"]
    text_mode: Literal["full", "lead"]
    # None where the unit kind does not read the field (see BuildSettings)
    max_group_tokens: int | None = None
    symmetric_links: bool | None = None
    passage_words: int | None = None
    # grouped units only; the TF-IDF fields only where the links are computed by TF-IDF
    links: str | None = None
    tfidf_top_m: int | None = None
    tfidf_threshold: float | None = None
    tfidf_features: int | None = None


class ChunkingBuild(_Frozen):
    max_tokens: int | None


class IndexBuild(_Frozen):
    factory: str
    metric: Literal["ip", "l2"]
    shards: int


class BuildSettings(_Frozen):
    """The config fields that decide what an index build holds -- its units, chunks and vectors.

    In: the embedding model, its input length, normalization, document prompt and Matryoshka dimension
    (they make the stored vectors); the unit settings that the unit kind reads (the group budget, link
    symmetry and link source only for grouped units, the TF-IDF link settings only where they make the
    links, the passage length only for passages); chunking; the FAISS factory, metric and shard count.
    Out: ``embedding.query_instruction`` (it changes query vectors only, and the query encoder reads
    it from the serving config), resources (batch size, device and dtype, GPUs, actor counts, replicas) and the
    reader/serving sections. Settings outside may change between a build and its resume, and an
    evaluation reuses a build whatever they are."""

    embedding: EmbeddingBuild
    units: UnitsBuild
    chunking: ChunkingBuild
    index: IndexBuild

    @classmethod
    def of(cls, config: LongRAGConfig | Mapping[str, Any]) -> BuildSettings:
        """The settings of a config, or of its ``model_dump`` (a manifest's ``config``); fields an
        older dump lacks take the current defaults."""
        data = config.model_dump(mode="json") if isinstance(config, BaseModel) else dict(config)

        def section(name: str, model: type[BaseModel]) -> dict[str, Any]:
            return {**model().model_dump(mode="json"), **dict(data.get(name) or {})}

        emb, units = section("embedding", EmbeddingConfig), section("units", UnitConfig)
        chunking, index = section("chunking", ChunkConfig), section("index", IndexConfig)
        kind = units["kind"]
        tfidf = kind == "grouped" and units["links"] in ("tfidf", "both")
        return cls(
            embedding=EmbeddingBuild(
                model=emb["model"], max_seq_length=emb["max_seq_length"], normalize=emb["normalize"],
                document_instruction=emb.get("document_instruction"), dim=emb.get("dim"),
            ),
            units=UnitsBuild(
                kind=kind, text_mode=units["text_mode"],
                max_group_tokens=units["max_group_tokens"] if kind == "grouped" else None,
                symmetric_links=units["symmetric_links"] if kind == "grouped" else None,
                passage_words=units["passage_words"] if kind == "passage" else None,
                # None for hyperlinks, the default: builds made before the field keep their fingerprint
                links=units["links"] if kind == "grouped" and units["links"] != "hyperlinks" else None,
                **{k: units[k] if tfidf else None for k in ("tfidf_top_m", "tfidf_threshold", "tfidf_features")},
            ),
            chunking=ChunkingBuild(max_tokens=chunking["max_tokens"]),
            index=IndexBuild(factory=index["factory"], metric=index["metric"], shards=index["shards"]),
        )

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """Section -> fields, leaving out the unit fields the unit kind does not read."""
        out = self.model_dump(mode="json")
        out["units"] = {k: v for k, v in out["units"].items() if v is not None}
        out["embedding"] = {k: v for k, v in out["embedding"].items()
                            if v is not None or k not in ("document_instruction", "dim")}
        return out

    def diff(self, other: BuildSettings) -> list[str]:
        """``section.field`` names whose values differ, sorted."""
        a, b = self.model_dump(mode="json"), other.model_dump(mode="json")
        return sorted(f"{sec}.{key}" for sec in a for key in a[sec] if a[sec][key] != b[sec][key])


# ------------------------------------------------------------------------------------------ the plan
def group_documents(docs: list[Document], config: LongRAGConfig) -> list[Unit]:
    """Retrieval units of ``config.units.kind``, token budgets counted with the embedding model's own
    tokenizer (its folder, or its Hugging Face cache snapshot for a hub name like bge-large)."""
    from longrag.index.embedding import tokenizer_dir
    from longrag.index.units import make_units
    from longrag.text.tokens import counter_for_model_dir

    return make_units(
        docs,
        kind=config.units.kind,
        counter=counter_for_model_dir(tokenizer_dir(config.embedding.model)),
        budget=config.units.max_group_tokens,
        passage_words=config.units.passage_words,
        symmetric=config.units.symmetric_links,
    )


def assign_shards(units: list[Unit], n_shards: int) -> list[int]:
    """Balance shards by tokens: largest unit first onto the lightest shard (deterministic; units
    in id order, as :func:`longrag.index.units.make_units` numbers them)."""
    import numpy as np

    from longrag.index.units import assign_shards_array

    order = sorted(range(len(units)), key=lambda i: units[i].unit_id)
    toks = np.asarray([units[i].n_tokens for i in order], dtype=np.int64)
    shard_of = [0] * len(units)
    for i, s in zip(order, assign_shards_array(toks, n_shards).tolist()):
        shard_of[i] = int(s)
    return shard_of


def chunk_limits(config: LongRAGConfig) -> tuple[int, int]:
    """``(model input limit, tokens per chunk)``. The encoder adds [CLS]/[SEP] (or <bos>/<eos>) and the
    document prompt (EmbeddingGemma's ``title: none | text: ``), so chunks stay that many tokens under its
    input limit (:func:`longrag.index.embedding.chunk_token_limit`); a larger ``chunking.max_tokens`` is
    refused."""
    from longrag.index.embedding import chunk_token_limit, resolve_embedding_model

    spec = resolve_embedding_model(config.embedding.model)
    model_max = config.embedding.max_seq_length or spec.max_seq_length or 512
    limit = chunk_token_limit(config.embedding, model_max, spec)
    max_tokens = config.chunking.max_tokens or limit
    if max_tokens > limit:
        raise ValueError(f"chunking.max_tokens={max_tokens} exceeds the model input ({model_max} tokens incl. specials"
                         f" and the document prompt: at most {limit})")
    return model_max, max_tokens


@dataclass(kw_only=True)
class PlanBase:
    """What every build plan states, whoever grouped the units: the config and its settings, the
    documents read, the manifest's ``plan`` digests, the chunk size, grouping's figures and the unit
    link graph. :func:`start_build`, :func:`resume_decision` and :func:`finish_build` read only this
    and :meth:`units_per_shard`."""

    config: LongRAGConfig
    settings: BuildSettings
    documents: int
    digests: dict[str, str]
    model_max: int
    max_tokens: int
    grouping: dict[str, Any] = field(default_factory=dict)
    group_s: float = 0.0
    graph: Any = None  # longrag.index.graph.UnitGraph, written with the manifest

    @property
    def n_shards(self) -> int:
        return len(self.units_per_shard())

    def units_per_shard(self) -> dict[int, int]:
        raise NotImplementedError


@dataclass(kw_only=True)
class BuildPlan(PlanBase):
    """Units grouped in the driver, and their shards; ``digests`` is the manifest's ``plan``."""

    units: list[Unit]
    shard_of: list[int]
    units_by_shard: dict[int, list[Unit]]

    def units_per_shard(self) -> dict[int, int]:
        return {s: len(u) for s, u in self.units_by_shard.items()}

    def rows(self, shards: set[int] | list[int]) -> list[dict[str, Any]]:
        """The units of ``shards`` as rows for the chunk + embed step (id, titles, text, shard)."""
        todo = set(shards)
        return [{"unit_id": u.unit_id, "titles": u.titles, "text": u.text, "shard": s}
                for u, s in zip(self.units, self.shard_of) if s in todo]


def plan_build(docs: list[Document], config: LongRAGConfig) -> BuildPlan:
    """Group ``docs`` into units and assign them to ``index.shards`` shards (fewer when there are
    fewer units)."""
    from longrag.index.graph import links_units, unit_graph_from_documents
    from longrag.index.units import grouping_stats

    model_max, max_tokens = chunk_limits(config)
    t0 = time.perf_counter()
    units = group_documents(docs, config)
    group_s = time.perf_counter() - t0
    log.info("grouped %d documents into %d %s units in %.1fs", len(docs), len(units), config.units.kind, group_s)
    n_shards = min(config.index.shards, len(units))
    shard_of = assign_shards(units, n_shards)
    units_by_shard: dict[int, list[Unit]] = {s: [] for s in range(n_shards)}
    for u, s in zip(units, shard_of):
        units_by_shard[s].append(u)
    return BuildPlan(config=config, settings=BuildSettings.of(config), documents=len(docs), units=units,
                     shard_of=shard_of, units_by_shard=units_by_shard, digests=shard_plan(units_by_shard),
                     model_max=model_max, max_tokens=max_tokens, grouping=grouping_stats(units), group_s=group_s,
                     graph=unit_graph_from_documents(docs, units, shard_of, linked=links_units(config.units.kind)))


@dataclass(kw_only=True)
class StagedPlan(PlanBase):
    """The plan of a distributed build (:mod:`longrag.index.distplan`): units were assembled and
    staged per shard by workers, which sent back each shard's unit count and plan digest; the driver
    never held a text."""

    shard_units: dict[int, int]

    def units_per_shard(self) -> dict[int, int]:
        return dict(self.shard_units)


AnyPlan = BuildPlan | StagedPlan


# ------------------------------------------------------------------------------------------ resume
def check_out(out: str, overwrite: bool, resume: bool = False) -> None:
    """Refuse to write into an existing build (complete or partial) unless ``overwrite``; with
    ``resume``, require an unfinished one."""
    from longrag.index.artifacts import ArtifactStore

    if overwrite and resume:
        raise ValueError("--overwrite and --resume exclude each other")
    status = ArtifactStore.open(out).status()
    if resume:
        if status == "absent":
            raise ResumeError(f"{out} holds no build to resume; run without --resume")
        if status == "complete":
            raise ResumeError(f"the build at {out} is already complete; nothing to resume")
        return
    if status != "absent" and not overwrite:
        hint = "--resume to finish it, " if status == "building" else ""
        raise BuildExistsError(
            f"{out} already holds a build (status {status!r}); pass {hint}--overwrite to replace it "
            "or choose another --out"
        )


def resume_decision(store: Any, manifest: Manifest, plan: AnyPlan) -> tuple[dict[int, ShardEntry], dict[int, str]]:
    """For a resume: (shards to keep, {shard: why it is rebuilt}). Raises ResumeError when the
    interrupted build has other :class:`BuildSettings` or gives other units."""
    from longrag.index.artifacts import verify_shard
    from longrag.store import ChecksumError

    changed = plan.settings.diff(BuildSettings.of(manifest.config))
    if changed:
        raise ResumeError(f"the build settings differ from the interrupted build's ({', '.join(changed)}); "
                          "resume with the same config or pass --overwrite")
    if not manifest.plan:
        raise ResumeError("the interrupted build recorded no shard plan (it predates resumable builds); "
                          "pass --overwrite to rebuild it")
    if manifest.plan != plan.digests:
        if set(manifest.plan) != set(plan.digests):
            detail = f"{len(manifest.plan)} shards planned, {len(plan.digests)} now"
        else:
            detail = f"units of shards {sorted(int(s) for s in plan.digests if plan.digests[s] != manifest.plan[s])} differ"
        raise ResumeError(f"the corpus gives other units than the interrupted build ({detail}); "
                          "resume from the same source or pass --overwrite")
    keep: dict[int, ShardEntry] = {}
    redo: dict[int, str] = {}
    done = store.completed_shards()
    for shard_id, planned in sorted(plan.units_per_shard().items()):
        entry = done.get(shard_id)
        if entry is None:
            redo[shard_id] = "not written"
            continue
        if entry.n_units != planned:
            redo[shard_id] = f"holds {entry.n_units} units, planned {planned}"
            continue
        try:
            verify_shard(store, shard_id)
        except (ChecksumError, FileNotFoundError) as exc:
            redo[shard_id] = f"failed verification: {exc}"
            continue
        keep[shard_id] = entry
    return keep, redo


# ------------------------------------------------------------------------------------------ manifest
@dataclass
class BuildStart:
    """A build under way: its ``building`` manifest, the shards kept by a resume and those to build."""

    manifest: Manifest
    kept: dict[int, ShardEntry]
    redo: dict[int, str]
    pending: list[int]


def start_build(store: Any, plan: AnyPlan, *, resume: bool, command: list[str] | None) -> BuildStart:
    """Write the ``building`` manifest (or, with ``resume``, take the interrupted one and decide which
    shards to keep)."""
    from longrag.index.embedding import embedding_dim, embedding_prompts, resolve_embedding_model

    kept: dict[int, ShardEntry] = {}
    redo: dict[int, str] = {}
    if resume:
        manifest = store.read_manifest()
        kept, redo = resume_decision(store, manifest, plan)
        log.info("resuming build %s: keeping shards %s, building %s", manifest.build_id, sorted(kept), redo)
        manifest.provenance.command = list(command or sys.argv)
    else:
        spec = resolve_embedding_model(plan.config.embedding.model)
        query_prompt, document_prompt = embedding_prompts(plan.config.embedding, spec)
        manifest = Manifest.create(
            plan.config,
            dim=embedding_dim(plan.config.embedding, spec) or _probe_dim(plan.config),
            max_seq_length=plan.model_max,
            query_instruction=query_prompt or None,
            document_instruction=document_prompt or None,
            documents=plan.documents,
            argv=command or sys.argv,
        )
        manifest.plan = plan.digests
        store.write_manifest(manifest)  # status "building" until every shard is in
    pending = [s for s in range(plan.n_shards) if s not in kept]
    return BuildStart(manifest=manifest, kept=kept, redo=redo, pending=pending)


def finish_build(store: Any, out: str, plan: AnyPlan, start: BuildStart, built: list[ShardEntry], *,
                 read_report: dict[str, Any], timings: dict[str, float], resume: bool) -> dict[str, Any]:
    """Record every shard, mark the manifest complete (written last) and return the build report.
    A planned shard that produced no entry fails the build, naming it."""
    entries = sorted([*start.kept.values(), *built], key=lambda e: e.shard_id)
    missing = sorted(set(range(plan.n_shards)) - {e.shard_id for e in entries})
    if missing:
        raise RuntimeError(f"shards {missing} produced no output (no chunks?); the build is incomplete")
    manifest = start.manifest
    for entry in entries:
        manifest.add_shard(entry)
    if plan.graph is not None:
        from longrag.index.artifacts import write_unit_graph
        from longrag.index.graph import GRAPH_FILE

        manifest.artifacts[GRAPH_FILE] = write_unit_graph(store, plan.graph)
    manifest.mark_complete()
    report: dict[str, Any] = {
        "out": out,
        "build_id": manifest.build_id,
        "counts": {**manifest.counts.model_dump(), "shards": len(manifest.shards)},
        "grouping": plan.grouping,
        "graph": None if plan.graph is None else {"units": plan.graph.n_units, "links": plan.graph.n_links},
        "read": read_report,
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
    }
    if resume:
        report["resume"] = {"kept_shards": sorted(start.kept), "built_shards": start.pending,
                            "why_built": {str(s): r for s, r in start.redo.items()}}
    store.storage.write_bytes("build_report.json", json.dumps(report, indent=2).encode())
    store.write_manifest(manifest)  # written last: the build is complete only now
    return report


def _probe_dim(config: LongRAGConfig) -> int:
    """Dimension of a model the registry does not know, read off the loaded model."""
    from longrag.index.embedding import Embedder

    return Embedder(config.embedding).dim
