"""Build a LongRAG index: parse -> group -> chunk + embed -> shard -> manifest.

    python -m jobs.index --source data/sample/enwiki-sample-106-articles.xml.bz2 --format wikixml \
        --out artifacts/sample --unit grouped --text-mode lead --shards 2

    ray job submit --working-dir . -- python -m jobs.index --source ... --out s3://bucket/builds/wiki

Ray Data parses pages in parallel and runs the chunk + embed step in an actor pool (GPUs per actor
from ``embedding.num_gpus``); grouping (LongRAG, Jiang et al., 2024, Section 3.1, Algorithm 1) runs
on the driver between them, as it needs the whole link graph. Each shard is built by one task from
its own chunks (units never span shards) and written to the artifact store with checksums; the
manifest is written last and marked complete, so a reader never sees half a build. An existing
build at ``--out`` is refused unless ``--overwrite`` is given: two builds are never mixed.

An interrupted build (status ``building``) continues with ``--resume``: the units are recomputed
from the same source and config, and a shard already written is kept when its plan digest (the
units it holds) matches and its files pass their sha256 check; only the other shards are chunked,
embedded and built. A resume whose config or units differ from the interrupted build is refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from actors.embedding import ChunkEmbedder
from cluster.local import start_or_join
from longrag.cli import number
from longrag.config import LongRAGConfig, build_settings, load_config
from longrag.index.manifest import ShardEntry
from longrag.types import Chunk, Document, Unit

log = logging.getLogger("jobs.index")


# ---------------------------------------------------------------------------------------- stages
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


def group_documents(docs: list[Document], config: LongRAGConfig) -> list[Unit]:
    """Retrieval units of ``config.units.kind``, token budgets counted with the embedding model's own
    tokenizer (its folder, or its Hugging Face cache snapshot for a hub name like bge-large)."""
    from longrag.index.embedding import tokenizer_dir
    from longrag.index.grouping import make_units
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
    """Balance shards by tokens: largest unit first onto the lightest shard (deterministic)."""
    load = [0] * n_shards
    shard_of = [0] * len(units)
    for i in sorted(range(len(units)), key=lambda i: (-units[i].n_tokens, units[i].unit_id)):
        s = min(range(n_shards), key=lambda s: (load[s], s))
        shard_of[i] = s
        load[s] += units[i].n_tokens
    return shard_of


class _ChunkUnits:
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


class _BuildShard:
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


# ---------------------------------------------------------------------------------------- driver
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


def check_out(out: str, overwrite: bool, resume: bool = False) -> None:
    """Refuse to write into an existing build (complete or partial) unless ``overwrite``; with
    ``resume``, require an unfinished one."""
    from longrag.store import ArtifactStore

    if overwrite and resume:
        raise ValueError("--overwrite and --resume exclude each other")
    store = ArtifactStore.open(out)
    status = store.status()
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


def reusable_shards(store: Any, manifest: Any, plan: dict[str, str], config: LongRAGConfig,
                    units_by_shard: dict[int, list[Unit]]) -> tuple[dict[int, ShardEntry], dict[int, str]]:
    """For a resume: (shards to keep, {shard: why it is rebuilt}). Raises ResumeError when the
    interrupted build was made with other build settings (:func:`longrag.config.build_settings`;
    resources and serving settings may differ) or gives other units."""
    from longrag.store import ChecksumError, verify_shard

    now, then = build_settings(config), build_settings(manifest.config)
    if now != then:
        changed = sorted(f"{sec}.{key}" for sec in now for key in set(now[sec]) | set(then.get(sec, {}))
                         if now[sec].get(key) != then.get(sec, {}).get(key))
        raise ResumeError(f"the build settings differ from the interrupted build's ({', '.join(changed)}); "
                          "resume with the same config or pass --overwrite")
    if not manifest.plan:
        raise ResumeError("the interrupted build recorded no shard plan (it predates resumable builds); "
                          "pass --overwrite to rebuild it")
    if manifest.plan != plan:
        if set(manifest.plan) != set(plan):
            detail = f"{len(manifest.plan)} shards planned, {len(plan)} now"
        else:
            detail = f"units of shards {sorted(int(s) for s in plan if plan[s] != manifest.plan[s])} differ"
        raise ResumeError(f"the corpus gives other units than the interrupted build ({detail}); "
                          "resume from the same source or pass --overwrite")
    keep: dict[int, ShardEntry] = {}
    redo: dict[int, str] = {}
    done = store.completed_shards()
    for shard_id in sorted(units_by_shard):
        entry = done.get(shard_id)
        if entry is None:
            redo[shard_id] = "not written"
            continue
        if entry.n_units != len(units_by_shard[shard_id]):
            redo[shard_id] = f"holds {entry.n_units} units, planned {len(units_by_shard[shard_id])}"
            continue
        try:
            verify_shard(store, shard_id)
        except (ChecksumError, FileNotFoundError) as exc:
            redo[shard_id] = f"failed verification: {exc}"
            continue
        keep[shard_id] = entry
    return keep, redo


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
    """Group, chunk, embed and shard ``docs`` into a build at ``out``; returns the build report.

    With ``resume``, continue the unfinished build at ``out`` (see the module docstring)."""
    from longrag.index.embedding import resolve_embedding_model
    from longrag.index.grouping import grouping_stats
    from longrag.index.manifest import Manifest, shard_plan
    from longrag.store import ArtifactStore

    timings = dict(timings or {})
    read_report = read_report or {"n_ok": len(docs), "n_bad": 0}
    t_all = time.perf_counter()
    check_out(out, overwrite, resume)
    store = ArtifactStore.open(out)
    if overwrite:
        for key in store.storage.list(""):
            store.storage.delete(key)

    spec = resolve_embedding_model(config.embedding.model)
    model_max = config.embedding.max_seq_length or spec.max_seq_length or 512
    # The encoder adds [CLS]/[SEP] (or <s>/</s>): keep chunks 2 tokens under its input limit.
    max_tokens = config.chunking.max_tokens or model_max - 2
    if max_tokens > model_max - 2:
        raise ValueError(f"chunking.max_tokens={max_tokens} exceeds the model input ({model_max} tokens incl. specials)")

    t0 = time.perf_counter()
    units = group_documents(docs, config)
    timings["group_s"] = time.perf_counter() - t0
    stats = grouping_stats(units)
    log.info("grouped %d documents into %d %s units in %.1fs", len(docs), len(units), config.units.kind, timings["group_s"])

    n_shards = min(config.index.shards, len(units))
    shard_of = assign_shards(units, n_shards)
    units_by_shard: dict[int, list[Unit]] = {s: [] for s in range(n_shards)}
    for u, s in zip(units, shard_of):
        units_by_shard[s].append(u)

    plan = shard_plan(units_by_shard)
    kept: dict[int, ShardEntry] = {}
    redo: dict[int, str] = {}
    if resume:
        manifest = store.read_manifest()
        kept, redo = reusable_shards(store, manifest, plan, config, units_by_shard)
        log.info("resuming build %s: keeping shards %s, building %s", manifest.build_id, sorted(kept),
                 redo)
        manifest.provenance.command = list(command or sys.argv)
    else:
        manifest = Manifest.create(
            config,
            dim=spec.dim or _probe_dim(config),
            max_seq_length=model_max,
            query_instruction=spec.query_instruction,
            documents=len(docs),
            argv=command or sys.argv,
        )
        manifest.plan = plan
        store.write_config(config)
        store.write_manifest(manifest)  # status "building" until every shard is in
    pending = [s for s in range(n_shards) if s not in kept]

    t0 = time.perf_counter()
    entries = [e.model_dump() for e in kept.values()]
    if pending:
        entries += _build_shards(out, config, units, shard_of, units_by_shard, pending, max_tokens)
    entries.sort(key=lambda e: e["shard_id"])
    timings["chunk_embed_shard_s"] = time.perf_counter() - t0
    built_ids = {e["shard_id"] for e in entries}
    missing = sorted(set(range(n_shards)) - built_ids)
    if missing:
        raise RuntimeError(f"shards {missing} produced no output (no chunks?); the build is incomplete")

    for entry in entries:
        manifest.add_shard(ShardEntry.model_validate(entry))
    manifest.mark_complete()
    timings["total_s"] = time.perf_counter() - t_all + timings.get("parse_s", 0.0)
    report = {
        "out": out,
        "build_id": manifest.build_id,
        "counts": {**manifest.counts.model_dump(), "shards": len(manifest.shards)},
        "grouping": stats,
        "read": read_report,
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
    }
    if resume:
        report["resume"] = {"kept_shards": sorted(kept), "built_shards": pending,
                            "why_built": {str(s): r for s, r in redo.items()}}
    store.storage.write_bytes("build_report.json", json.dumps(report, indent=2).encode())
    store.write_manifest(manifest)  # written last: the build is complete only now
    return report


def _build_shards(
    out: str,
    config: LongRAGConfig,
    units: list[Unit],
    shard_of: list[int],
    units_by_shard: dict[int, list[Unit]],
    pending: list[int],
    max_tokens: int,
) -> list[dict[str, Any]]:
    """Chunk, embed and build the ``pending`` shards with Ray Data; their manifest entries (dicts)."""
    todo = set(pending)
    rows = [{"unit_id": u.unit_id, "titles": u.titles, "text": u.text, "shard": s}
            for u, s in zip(units, shard_of) if s in todo]
    emb = config.embedding
    ds = ray.data.from_items(rows, override_num_blocks=max(1, min(len(rows) // 16, 200)))
    ds = ds.map_batches(
        _ChunkUnits,
        fn_constructor_kwargs={"model": config.embedding.model, "max_tokens": max_tokens},
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
    units_ref = ray.put({s: units_by_shard[s] for s in pending})
    built = ds.groupby("shard", num_partitions=len(pending)).map_groups(
        _BuildShard,
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
    return [json.loads(r["entry"]) for r in built.iter_rows()]


def _probe_dim(config: LongRAGConfig) -> int:
    """Dimension of a model the registry does not know, read off the loaded model."""
    from longrag.index.embedding import Embedder

    return Embedder(config.embedding).dim


class BuildExistsError(RuntimeError):
    """The output location already holds a build (complete or partial)."""


class ResumeError(RuntimeError):
    """A resume was asked for but cannot be done (no unfinished build, or another config/corpus)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.index", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True, help="wiki XML dump (.xml/.xml.bz2), JSONL or parquet documents")
    p.add_argument("--format", choices=["wikixml", "jsonl", "parquet"], required=True)
    p.add_argument("--out", required=True, help="build directory or s3://bucket/prefix")
    p.add_argument("--shards", type=number(int, min_value=1), help="number of index shards (index.shards)")
    p.add_argument("--unit", choices=["grouped", "document", "passage"], help="retrieval unit kind (units.kind)")
    p.add_argument("--text-mode", choices=["full", "lead"], help="whole pages or lead sections (units.text_mode)")
    p.add_argument("--max-group-tokens", type=number(int, min_value=1),
                   help="token budget of a grouped unit (units.max_group_tokens)")
    p.add_argument("--embedding-model", help="embedding.model")
    p.add_argument("--config", help="YAML config file (LongRAGConfig)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config override")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a new local Ray)")
    p.add_argument("--num-cpus", type=number(float, min_value=0, min_exclusive=True), default=4,
                   help="logical CPUs for a new local Ray")
    p.add_argument("--overwrite", action="store_true", help="replace an existing build at --out")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted build at --out (same source and config): keep its verified shards")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> LongRAGConfig:
    overrides = list(args.set)
    for flag, key in [
        ("shards", "index.shards"),
        ("unit", "units.kind"),
        ("text_mode", "units.text_mode"),
        ("max_group_tokens", "units.max_group_tokens"),
        ("embedding_model", "embedding.model"),
    ]:
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    return load_config(args.config, overrides)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # refuse before starting anything
        check_out(args.out, args.overwrite, args.resume)
    except (BuildExistsError, ResumeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    handle = start_or_join(args.address, num_cpus=args.num_cpus)
    try:
        report = build_index(args.source, args.format, args.out, config, overwrite=args.overwrite,
                             resume=args.resume, command=["python", "-m", "jobs.index", *(argv if argv is not None else sys.argv[1:])])
    except Exception as exc:
        log.error("index build failed: %s", exc)
        print(f"error: {exc}", file=sys.stderr)
        from longrag.store import ArtifactStore

        try:
            if not isinstance(exc, (BuildExistsError, ResumeError)) and ArtifactStore.open(args.out).status() == "building":
                print(f"the shards written so far are kept: rerun with --resume to finish the build at {args.out}",
                      file=sys.stderr)
        except Exception:  # the store itself may be what failed
            pass
        return 1
    finally:
        handle.shutdown()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
