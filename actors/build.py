"""The parallel part of an index build, on Ray Data: parse pages in read tasks, chunk + embed in an
actor pool, build one FAISS index per shard (``map_groups`` by shard), from the plan of
:mod:`longrag.index.plan`.

Ray Data parses pages in parallel and runs the chunk + embed step in an actor pool (GPUs per actor
from ``embedding.num_gpus``); grouping (LongRAG, Jiang et al., 2024, Section 3.1, Algorithm 1) runs
on the driver between them (:func:`longrag.index.plan.plan_build`), as it needs the whole link
graph. Each shard is built by one task from its own chunks (units never span shards) and written to
the artifact store with checksums; the manifest is written last and marked complete, so a reader
never sees half a build. An existing build at ``out`` is refused unless ``overwrite`` is given.

An interrupted build (status ``building``) continues with ``resume``: the units are recomputed
from the same source and config, and a shard already written is kept when its plan digest (the
units it holds) matches and its files pass their sha256 check; only the other shards are chunked,
embedded and built (:func:`longrag.index.plan.resume_decision`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import numpy as np
import ray

from actors.embedding import ChunkEmbedder
from longrag.config import LongRAGConfig
from longrag.index.manifest import ShardEntry
from longrag.index.plan import BuildPlan, check_out, finish_build, plan_build, start_build
from longrag.types import Chunk, Document, Unit

log = logging.getLogger(__name__)


def read_corpus(source: str, fmt: str, text_mode: str) -> tuple[list[Document], dict[str, Any]]:
    """Documents from the source; wikitext pages are parsed in parallel by Ray Data.

    Pages that cannot be parsed (no text left, say) are counted and reported with their reason,
    never dropped silently."""
    from longrag.corpus import documents, wikitext

    if fmt != "wikixml":
        if text_mode != "full":
            raise ValueError(f"units.text_mode={text_mode!r} needs sections: it applies to --format wikixml only")
        docs, report = documents.read_documents(source, fmt, text_mode="full")
        return docs, report.to_dict()

    redirects: dict[str, str] = {}
    pages: list[dict[str, Any]] = []
    for page in wikitext.iter_pages(source):
        if page.redirect:
            redirects[wikitext.normalize_title(page.title)] = wikitext.normalize_title(page.redirect)
        else:
            pages.append(page.to_row())
    log.info("read %d pages and %d redirects from %s", len(pages), len(redirects), source)
    report: dict[str, Any] = {"source": source, "fmt": fmt, "pages": len(pages), "redirects": len(redirects)}
    if not pages:
        return [], {**report, "n_ok": 0, "n_bad": 0, "bad": []}

    def parse(row: dict[str, Any]) -> dict[str, Any]:
        doc, reason = wikitext.try_parse_page(wikitext.RawPage.from_row(row), text_mode=text_mode)
        if doc is None:
            return {"ok": False, "title": row["title"], "reason": reason, "doc": None}
        return {"ok": True, "title": row["title"], "reason": None, "doc": json.dumps(doc.to_row())}

    blocks = max(1, min(len(pages) // 8, 64))
    rows = ray.data.from_items(pages, override_num_blocks=blocks).map(parse).take_all()
    docs = [Document.from_row(json.loads(r["doc"])) for r in rows if r["ok"]]
    bad = [{"title": r["title"], "reason": r["reason"]} for r in rows if not r["ok"]]
    for b in bad:
        log.warning("skipped page %r: %s", b["title"], b["reason"])
    docs.sort(key=lambda d: (len(d.doc_id), d.doc_id))
    docs = wikitext.resolve_redirects(docs, redirects)
    return docs, {**report, "n_ok": len(docs), "n_bad": len(bad), "bad": bad[:20]}


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
            Unit(unit_id=str(u), doc_ids=[], titles=list(t), text=str(x), n_tokens=0)
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


class BuildShard:
    """Ray Data ``map_groups`` callable: all chunks of one shard -> FAISS index + files in the store."""

    def __init__(self, store_uri: str, units_ref: list[Any], factory: str, metric: str) -> None:
        from longrag.store import ArtifactStore

        self.store = ArtifactStore.open(store_uri)
        self.units_by_shard: dict[int, list[Unit]] = ray.get(units_ref[0])
        self.factory, self.metric = factory, metric

    def __call__(self, group: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        from longrag.index.maxp import MaxPIndex
        from longrag.store import write_shard

        shard = int(group["shard"][0])
        order = np.lexsort((group["position"], group["unit_id"]))
        vectors = np.ascontiguousarray(np.stack(group["vector"][order]), dtype=np.float32)
        chunks = [
            Chunk(
                chunk_id=str(group["chunk_id"][i]),
                unit_id=str(group["unit_id"][i]),
                position=int(group["position"][i]),
                text=str(group["text"][i]),
                n_tokens=int(group["n_tokens"][i]),
            )
            for i in order
        ]
        index = MaxPIndex.build(
            vectors,
            chunk_ids=[c.chunk_id for c in chunks],
            unit_ids=[c.unit_id for c in chunks],
            factory=self.factory,
            metric=self.metric,
        )
        entry = write_shard(self.store, shard, self.units_by_shard[shard], chunks, index)
        return {"shard": [shard], "entry": [json.dumps(entry.model_dump())]}


def build_shards(out: str, plan: BuildPlan, pending: list[int]) -> list[ShardEntry]:
    """Chunk, embed and build the ``pending`` shards of ``plan`` with Ray Data; their manifest entries."""
    config = plan.config
    rows = plan.rows(pending)
    emb = config.embedding
    ds = ray.data.from_items(rows, override_num_blocks=max(1, min(len(rows) // 16, 200)))
    ds = ds.map_batches(
        ChunkUnits,
        fn_constructor_kwargs={"model": emb.model, "max_tokens": plan.max_tokens},
        batch_size=16,
        concurrency=1,
        num_cpus=0.25,
    )
    ds = ds.map_batches(
        ChunkEmbedder,
        fn_constructor_kwargs={"embedding_config": emb.model_dump()},
        batch_size=emb.batch_size,
        concurrency=emb.concurrency,
        num_cpus=emb.num_cpus,
        num_gpus=emb.num_gpus,
    )
    units_ref = ray.put({s: plan.units_by_shard[s] for s in pending})
    built = ds.groupby("shard", num_partitions=len(pending)).map_groups(
        BuildShard,
        fn_constructor_kwargs={
            "store_uri": out,
            "units_ref": [units_ref],
            "factory": config.index.factory,
            "metric": config.index.metric,
        },
        batch_format="numpy",
        concurrency=1,
        num_cpus=0.25,
    )
    return [ShardEntry.model_validate(json.loads(r["entry"])) for r in built.iter_rows()]


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
    from longrag.store import ArtifactStore

    timings = dict(timings or {})
    read_report = read_report or {"n_ok": len(docs), "n_bad": 0}
    t_all = time.perf_counter()
    check_out(out, overwrite, resume)
    store = ArtifactStore.open(out)
    if overwrite:
        for key in store.storage.list(""):
            store.storage.delete(key)
    plan = plan_build(docs, config)
    timings["group_s"] = plan.group_s
    start = start_build(store, plan, resume=resume, command=command)
    t0 = time.perf_counter()
    built = build_shards(out, plan, start.pending) if start.pending else []
    timings["chunk_embed_shard_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_all + timings.get("parse_s", 0.0)
    return finish_build(store, out, plan, start, built, read_report=read_report, timings=timings, resume=resume)


def build_index(
    source: str,
    fmt: str,
    out: str,
    config: LongRAGConfig,
    *,
    overwrite: bool = False,
    resume: bool = False,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """Read ``source`` and build its index on the connected Ray cluster; returns the build report."""
    check_out(out, overwrite, resume)
    t0 = time.perf_counter()
    docs, read_report = read_corpus(source, fmt, config.units.text_mode)
    parse_s = time.perf_counter() - t0
    if not docs:
        raise ValueError(f"no documents could be read from {source} ({read_report})")
    log.info("parsed %d documents in %.1fs", len(docs), parse_s)
    return build_from_documents(docs, out, config, read_report=read_report, overwrite=overwrite,
                                resume=resume, command=command, timings={"parse_s": parse_s})
