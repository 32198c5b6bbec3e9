"""Chunk + embed + shard on Ray Data, and the build from documents held in memory.

:func:`build_shards` is the last stage of every build: the units of each pending shard are staged
in the store (by the distributed assembly of :mod:`actors.distbuild`, or by :func:`stage_units`
from an in-driver plan); Ray Data reads them part by part, chunks them (one actor) and embeds them in
an actor pool sized from the cluster (:func:`actors.embedding.pool_options`), writing embedded chunks
back to staging; then one Ray task per shard builds its FAISS index and writes the shard with
checksums -- all shards at once, as many as the cluster has CPUs for. The manifest is written last
and marked complete, so a reader never sees half a build.

:func:`build_from_documents` builds from documents already in memory (the evaluation's corpora):
grouping (LongRAG, Jiang et al., 2024, Section 3.1, Algorithm 1) runs on the driver
(:func:`longrag.index.plan.plan_build`). A corpus read from files, with the driver holding metadata
only, is built by :func:`actors.distbuild.build_corpus_index`.

An interrupted build (status ``building``) continues with ``resume``: the units are recomputed
from the same source and config, and a shard already written is kept when its plan digest (the
units it holds) matches and its files pass their sha256 check; only the other shards are chunked,
embedded and built (:func:`longrag.index.plan.resume_decision`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from actors.embedding import chunker_compute, embed
from longrag import scoped
from longrag.config import LongRAGConfig
from longrag.index.capacity import shard_build_bytes
from longrag.index.embedding import CHUNKER_CPUS
from longrag.index.manifest import ShardEntry
from longrag.index.plan import AnyPlan, BuildPlan, check_out, finish_build, plan_build, start_build
from longrag.types import Chunk, Document, Unit

log = logging.getLogger(__name__)


class ChunkUnits:
    """Ray Data callable: units -> chunks that fit the embedding model's input."""

    def __init__(self, model: str, max_tokens: int) -> None:
        from longrag.index.embedding import tokenizer_dir
        from longrag.text.tokens import counter_for_model_dir

        # resolved on the worker: the model's cache folder may sit elsewhere than on the driver
        self.counter = counter_for_model_dir(tokenizer_dir(model))
        self.max_tokens = max_tokens

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        from longrag.index.chunking import chunk_units

        units = [
            Unit(unit_id=str(u), doc_ids=[], titles=[str(x) for x in t], text=str(x), n_tokens=0)
            for u, t, x in zip(batch["unit_id"], batch["titles"], batch["text"])
        ]
        shard_of = dict(zip(batch["unit_id"], batch["shard"]))
        chunks = chunk_units(units, self.max_tokens, self.counter)
        return {
            "chunk_id": [c.chunk_id for c in chunks],
            "unit_id": [c.unit_id for c in chunks],
            "position": [c.position for c in chunks],
            "text": [c.text for c in chunks],
            "n_tokens": [c.n_tokens for c in chunks],
            "shard": [int(shard_of[c.unit_id]) for c in chunks],
        }


STAGE_CPUS = 0.05
"""CPUs of the light stages around the embedding pool (reading staged units, writing embedded
chunks): small, so they always fit beside the pool sized by :func:`actors.embedding.pool_options`."""


def shard_column(batch: Any) -> Any:
    """Ray Data callable (pyarrow batches): the ``shard`` of each staged unit, from the part's path
    (``.../staging/units/shard-00003/part-00000.parquet``), in place of the path."""
    import pyarrow as pa

    from longrag.index.distplan import shard_of_staged_path

    paths = batch.column("path").to_pylist()
    shards = pa.array([shard_of_staged_path(p) for p in paths], pa.int64())
    return batch.drop_columns(["path"]).append_column("shard", shards)


def read_staged_units(paths: list[str], filesystem: Any) -> Any:
    """The staged unit parts at ``paths`` as a Ray Dataset of ``unit_id, titles, text, shard``,
    read by ``ray.data.read_parquet`` through the store's filesystem (local, S3, GCS).

    Through Ray Data's first parquet datasource (``DataContext.use_datasource_v2=False``, for this
    read only): the second one lists files in a task that asks for a whole CPU, which no option
    sets, and beside the chunker and the embedding pool on a 2-CPU machine that task never got one
    (``make demo`` waited forever). The first one lists on the driver and its read tasks take
    :data:`STAGE_CPUS`."""
    from ray.data import DataContext

    # the dataset keeps a copy of the context it was made with; the process' own is restored after
    with scoped.attribute(DataContext.get_current(), "use_datasource_v2", False):
        ds = ray.data.read_parquet(paths, filesystem=filesystem, columns=["unit_id", "titles", "text"],
                                   include_paths=True, ray_remote_args={"num_cpus": STAGE_CPUS})
    return ds.map_batches(shard_column, batch_format="pyarrow", num_cpus=STAGE_CPUS)


def stage_chunks(batch: dict[str, np.ndarray], store_uri: str) -> dict[str, list[int]]:
    """Ray Data callable: embedded chunks -> one parquet part per shard in the batch, under the
    shard's staging prefix; returns the chunk count per shard.

    A part is named by the chunks it holds (:func:`longrag.index.distplan.staged_chunks_key`): Ray runs a task again when
    its worker died after writing (a retry) or when its output block was lost with its node
    (reconstruction), with the same input block, and the second write replaces the first instead of
    adding a part with the same chunks (which the shard's build would refuse as duplicate chunk ids)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from longrag.index.artifacts import ArtifactStore
    from longrag.index.distplan import staged_chunks_key
    from longrag.records import table_bytes

    store = ArtifactStore.open(store_uri)
    shards = np.asarray(batch["shard"], dtype=np.int64)
    out_shard, out_n, out_text, out_dim = [], [], [], []
    for shard in np.unique(shards).tolist():
        sel = np.flatnonzero(shards == shard)
        vectors = np.ascontiguousarray(np.stack(batch["vector"][sel]), dtype=np.float32)
        table = pa.table({
            "chunk_id": pa.array([str(x) for x in batch["chunk_id"][sel]]),
            "unit_id": pa.array([str(x) for x in batch["unit_id"][sel]]),
            "position": pa.array(np.asarray(batch["position"][sel], dtype=np.int64)),
            "text": pa.array([str(x) for x in batch["text"][sel]]),
            "n_tokens": pa.array(np.asarray(batch["n_tokens"][sel], dtype=np.int64)),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1]),
        })
        key = staged_chunks_key(int(shard), table.column("chunk_id").to_pylist())
        store.storage.write_bytes(key, table_bytes(table))
        out_shard.append(int(shard))
        out_n.append(len(sel))
        out_text.append(int(pc.sum(pc.binary_length(table.column("text"))).as_py() or 0))
        out_dim.append(int(vectors.shape[1]))
    return {"shard": out_shard, "n_chunks": out_n, "text_bytes": out_text, "dim": out_dim}


def build_from_staging(store_uri: str, shard: int, factory: str, metric: str) -> str:
    """One shard from its staged units and embedded chunks -> FAISS index + files in the store;
    returns its manifest entry as JSON, and logs the task's peak resident memory (what
    :func:`longrag.index.capacity.shard_build_bytes` declares for it). Run as a Ray task,
    :data:`build_staged_shard`."""
    from longrag.memory import MemorySampler

    with MemorySampler(0.2) as mem:
        entry = _build_from_staging(store_uri, shard, factory, metric)
    log.info("shard %d built: peak RSS %.0f MB (%.0f MB above the task's start)", shard, mem.peak_mb, mem.extra_mb)
    return entry


def _build_from_staging(store_uri: str, shard: int, factory: str, metric: str) -> str:
    import pyarrow as pa

    from longrag.index.artifacts import ArtifactStore, write_shard
    from longrag.index.distplan import staged_chunks_prefix, staged_units_prefix
    from longrag.index.maxp import MaxPIndex

    store = ArtifactStore.open(store_uri)
    storage = store.storage

    def read(prefix: str) -> list[Any]:
        return [storage.read_table(k) for k in sorted(storage.list(prefix))]

    units = [Unit.from_row(r) for t in read(staged_units_prefix(shard)) for r in t.to_pylist()]
    parts = read(staged_chunks_prefix(shard))
    if not parts:
        raise RuntimeError(f"shard {shard}: no embedded chunks were staged (no chunks?)")
    table = pa.concat_tables(parts)
    del parts
    table = table.sort_by([("unit_id", "ascending"), ("position", "ascending")])
    dim = table.schema.field("vector").type.list_size
    vectors = np.ascontiguousarray(table.column("vector").combine_chunks().flatten().to_numpy().reshape(-1, dim),
                                   dtype=np.float32)
    table = table.drop_columns(["vector"])  # the float32 array is the only copy of the vectors from here
    chunks = [Chunk.from_row(r) for batch in table.to_batches(max_chunksize=65536) for r in batch.to_pylist()]
    del table
    index = MaxPIndex.build(vectors, chunk_ids=[c.chunk_id for c in chunks], unit_ids=[c.unit_id for c in chunks],
                            factory=factory, metric=metric)
    entry = write_shard(store, shard, units, chunks, index)
    return entry.model_dump_json()


#: :func:`build_from_staging` as a Ray task, one per shard: the shards of a build run in parallel, as
#: many at a time as the cluster has the task's resources for.
build_staged_shard = ray.remote(build_from_staging)


def stage_units(store: Any, plan: BuildPlan, shards: list[int]) -> None:
    """Write the units of ``shards`` of an in-driver plan to the staging area, as the distributed
    assembly (:mod:`actors.distbuild`) does."""
    from longrag.index.distplan import stage_shard_units

    for s in shards:
        stage_shard_units(store.storage, s, plan.units_by_shard[s])


def clear_staging(store: Any) -> None:
    from longrag.index.distplan import STAGING_PREFIX

    for key in store.storage.list(STAGING_PREFIX):
        store.storage.delete(key)


def build_shards(out: str, config: LongRAGConfig, max_tokens: int, pending: dict[int, int]) -> list[ShardEntry]:
    """Chunk, embed and build the ``pending`` shards whose units are staged in the store at ``out``:
    Ray Data reads the staged units, chunks them (one actor) and embeds them (an actor pool sized from
    the cluster, :func:`actors.embedding.pool_options`), writing embedded chunks back to staging; then
    one task per shard builds its index, all shards at once within the cluster's resources."""
    from longrag.index.artifacts import ArtifactStore
    from longrag.index.distplan import staged_parts, staged_units_key

    if not pending:
        return []
    emb = config.embedding
    storage = ArtifactStore.open(out).storage
    paths = [storage.path(staged_units_key(s, k)) for s, n in sorted(pending.items()) for k in range(staged_parts(n))]
    ds = read_staged_units(paths, storage.filesystem)
    ds = ds.map_batches(
        ChunkUnits,
        fn_constructor_kwargs={"model": emb.model, "max_tokens": max_tokens},
        batch_size=16,
        compute=chunker_compute(emb),  # grows with the embedding pool (one chunker feeds 64 CPU or 1 GPU actor)
        num_cpus=CHUNKER_CPUS,
    )
    ds = embed(ds, emb)  # the pool (and, on GPUs, a tokenizing stage before it: embedding.tokenize)
    ds = ds.map_batches(stage_chunks, fn_kwargs={"store_uri": out}, batch_format="numpy", num_cpus=STAGE_CPUS)
    n_chunks: dict[int, int] = {}
    text_bytes: dict[int, int] = {}
    dim = 1
    for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
        for s, n, t, d in zip(b["shard"], b["n_chunks"], b["text_bytes"], b["dim"]):
            n_chunks[int(s)] = n_chunks.get(int(s), 0) + int(n)
            text_bytes[int(s)] = text_bytes.get(int(s), 0) + int(t)
            dim = max(dim, int(d))
    log.info("embedded %d chunks of shards %s", sum(n_chunks.values()), sorted(pending))
    refs = []
    for s in sorted(pending):  # each build declares what it holds at its peak: parallel builds fit their nodes
        memory = shard_build_bytes(n_chunks.get(s, 0), dim, text_bytes.get(s, 0))
        log.info("shard %d: %d chunks, %.1f MB of text: the build task declares %.0f MB", s, n_chunks.get(s, 0),
                 text_bytes.get(s, 0) / 2**20, memory / 2**20)
        refs.append(build_staged_shard.options(num_cpus=1, memory=memory).remote(
            out, s, config.index.factory, config.index.metric))
    return [ShardEntry.model_validate_json(r) for r in ray.get(refs)]


def open_out(out: str, *, overwrite: bool, resume: bool) -> Any:
    """The artifact store at ``out`` for a new build (refused when a build is there, unless
    ``overwrite``, which empties it first; ``resume``: the unfinished build there)."""
    from longrag.index.artifacts import ArtifactStore

    check_out(out, overwrite, resume)
    store = ArtifactStore.open(out)
    if overwrite:
        for key in store.storage.list(""):
            store.storage.delete(key)
    return store


def build_planned(store: Any, out: str, config: LongRAGConfig, plan: AnyPlan, *,
                  read_report: dict[str, Any], timings: dict[str, float], started_at: float, resume: bool,
                  command: list[str] | None, corpus: Any = None,
                  stage: Callable[[list[int]], None] | None = None) -> dict[str, Any]:
    """The steps every build shares once its plan exists: the manifest started (``corpus`` recorded),
    ``stage(pending shards)`` (units not staged yet), the pending shards chunked, embedded and
    built (:func:`build_shards`), the manifest finished, staging
    cleared; ``timings["total_s"]`` runs from ``started_at``. Returns the build report."""
    start = start_build(store, plan, resume=resume, command=command)
    if corpus is not None:
        start.manifest.corpus = corpus
        if not resume:
            store.write_manifest(start.manifest)
    t0 = time.perf_counter()
    if stage is not None:
        stage(start.pending)
    sizes = plan.units_per_shard()
    built = build_shards(out, config, plan.max_tokens, {s: sizes[s] for s in start.pending})
    timings["chunk_embed_shard_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - started_at
    report = finish_build(store, out, plan, start, built, read_report=read_report, timings=timings, resume=resume)
    clear_staging(store)
    return report


def build_from_documents(
    docs: list[Document],
    out: str,
    config: LongRAGConfig,
    *,
    read_report: dict[str, Any] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    command: list[str] | None = None,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Group, chunk, embed and shard ``docs`` into a build at ``out`` on the connected Ray cluster;
    returns the build report. With ``resume``, continue the unfinished build at ``out``."""
    timings = dict(timings or {})
    t_all = time.perf_counter() - timings.get("parse_s", 0.0)  # the total counts the caller's parse too
    store = open_out(out, overwrite=overwrite, resume=resume)
    clear_staging(store)
    plan = plan_build(docs, config)
    timings["group_s"] = plan.group_s
    return build_planned(store, out, config, plan, read_report=read_report or {"n_ok": len(docs), "n_bad": 0},
                         timings=timings, started_at=t_all, resume=resume, command=command,
                         stage=lambda pending: stage_units(store, plan, pending))
