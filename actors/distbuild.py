"""An index build with no corpus on the driver, on Ray Data (issue: cluster-scale indexing).

1. Read + parse (Ray Data tasks, one per read task of :func:`longrag.corpus.sources.plan_read_tasks`:
   a file, a parquet row group, a bz2 stream of a multistream dump): pages/records become documents,
   token-counted with the embedding model's tokenizer, written as the build's ``documents/`` parquet
   parts; the driver gets back per document only ``(part, row, id, title, tokens)``.
2. Links (Ray Data actors, grouped units only): each part's links are resolved to document positions
   against the broadcast titles (and redirects); the driver gets ``(src, dst)`` integer arrays.
3. Plan (driver, :mod:`longrag.index.distplan`): corpus order, grouping (LongRAG, Jiang et al.,
   2024, Section 3.1, Algorithm 1) on arrays, shards balanced by tokens.
4. Assembly (Ray Data): the plan table (first unit of each document, shard of each unit) goes to
   the workers; document rows are grouped by shard and each shard's units are built, staged in the
   store and digested (the manifest's resume plan).
5. Chunk + embed + build (:func:`actors.build.build_shards`): one task per shard.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from actors.build import build_planned, clear_staging, open_out
from actors.distlinks import computed_edges
from actors.parts import collect_edges, over_parts, part_positions, read_part, row_keys
from longrag.config import LongRAGConfig
from longrag.index.distplan import DOCUMENTS_PREFIX, DocMeta
from longrag.index.manifest import CorpusArtifact, CorpusPart
from longrag.index.plan import StagedPlan, chunk_limits
from longrag.index.units import UnitPlan

log = logging.getLogger(__name__)

PART_ROWS = 2048
"""Documents per parquet part of ``documents/``."""
READ_REPORTS = f"{DOCUMENTS_PREFIX}_read/"


@functools.lru_cache(maxsize=4)
def _counter(model: str) -> Any:
    from longrag.index.embedding import tokenizer_dir
    from longrag.text.tokens import counter_for_model_dir

    return counter_for_model_dir(tokenizer_dir(model))


def _part_key(task: int, k: int) -> str:
    return f"{DOCUMENTS_PREFIX}part-{task:05d}-{k:04d}.parquet"


def _part_code(task: int, k: int) -> int:
    return task * 65536 + k


# ---------------------------------------------------------------------------------------- 1. parse
def parse_tasks(batch: dict[str, np.ndarray], store_uri: str, text_mode: str, model: str, kind: str,
                passage_words: int) -> Iterator[dict[str, Any]]:
    """Ray Data generator: read tasks -> documents written as parquet parts; yields their metadata.
    Redirects, bad records and the parts written go to a small JSON report per task."""
    from longrag.corpus.documents import documents_to_table
    from longrag.corpus.sources import ReadTask, read_task_records
    from longrag.index.artifacts import ArtifactStore
    from longrag.index.grouping import document_text
    from longrag.index.units import document_passages
    from longrag.records import table_bytes
    from longrag.store import sha256_bytes

    store = ArtifactStore.open(store_uri)
    counter = _counter(model)
    fields = list(ReadTask.__dataclass_fields__)
    for i in range(len(batch["task_id"])):
        task = ReadTask(**{f: batch[f][i].item() if hasattr(batch[f][i], "item") else batch[f][i] for f in fields})
        report: dict[str, Any] = {"task": asdict(task), "redirects": [], "bad": [], "parts": [], "n_ok": 0}
        docs: list[Any] = []
        seqs: list[int] = []

        def flush() -> dict[str, Any]:
            k = len(report["parts"])
            n_tok = counter.count_batch([document_text(d) for d in docs])
            table = documents_to_table(docs).append_column("n_tokens", pa.array(n_tok, type=pa.int64()))
            data = table_bytes(table)
            store.storage.write_bytes(_part_key(task.task_id, k), data)
            report["parts"].append({"key": _part_key(task.task_id, k), "rows": len(docs),
                                    "sha256": sha256_bytes(data), "bytes": len(data)})
            out = {"part": [_part_code(task.task_id, k)] * len(docs), "row": list(range(len(docs))),
                   "task": [task.task_id] * len(docs), "seq": list(seqs), "doc_id": [d.doc_id for d in docs],
                   "title": [d.title for d in docs], "n_tokens": n_tok}
            if kind == "passage":
                out["passage_tokens"] = [counter.count_batch(document_passages(d, passage_words)) for d in docs]
            docs.clear()
            seqs.clear()
            return out

        seq = 0
        try:
            for rec in read_task_records(task, text_mode):
                seq += 1
                if rec.kind == "doc":
                    docs.append(rec.doc)
                    seqs.append(seq)
                    report["n_ok"] += 1
                    if len(docs) >= PART_ROWS:
                        yield flush()
                elif rec.kind == "redirect":
                    report["redirects"].append([rec.title, rec.target])
                else:
                    report["bad"].append({"source": task.source, "line": rec.line, "title": rec.title or None,
                                          "reason": rec.reason, "record": rec.record})
        except ValueError as exc:  # a malformed export: keep the pages read before, say so
            if task.fmt != "wikixml":
                raise
            report["bad"].append({"source": task.source, "line": None, "title": None, "reason": str(exc), "record": None})
        last = flush() if docs else None
        store.storage.write_bytes(f"{READ_REPORTS}task-{task.task_id:05d}.json", json.dumps(report).encode())
        if last is not None:
            yield last


def read_metadata(sources: list[str], fmt: str, out: str, config: LongRAGConfig) -> tuple[DocMeta, list[dict[str, Any]], int]:
    """Stage 1: parse on Ray Data; returns the documents' metadata, the per-task reports, the task count."""
    from longrag.corpus.sources import plan_read_tasks
    from longrag.index.artifacts import ArtifactStore

    tasks = plan_read_tasks(sources, fmt)
    log.info("reading %d sources as %d read tasks", len(sources), len(tasks))
    ds = ray.data.from_items([asdict(t) for t in tasks], override_num_blocks=len(tasks))
    ds = ds.map_batches(parse_tasks, batch_size=1, fn_kwargs={
        "store_uri": out, "text_mode": config.units.text_mode, "model": config.embedding.model,
        "kind": config.units.kind, "passage_words": config.units.passage_words})
    meta = DocMeta.concat(list(ds.iter_batches(batch_size=None, batch_format="pyarrow")))
    store = ArtifactStore.open(out)
    reports = [json.loads(store.storage.read_bytes(k)) for k in sorted(store.storage.list(READ_REPORTS))]
    return meta, reports, len(tasks)


# ---------------------------------------------------------------------------------------- 2. links
class LinkResolver:
    """Ray Data callable: parts -> ``(src, dst)`` positions of their documents' resolved links
    (a dropped duplicate's links left out)."""

    def __init__(self, store_uri: str, shared: list[Any]) -> None:
        from longrag.index.artifacts import ArtifactStore
        from longrag.index.grouping import title_keys

        self.store = ArtifactStore.open(store_uri)
        titles, self.redirects, (self.lookup_keys, self.lookup_pos) = ray.get(shared[0])
        self.keys = title_keys(titles.to_pylist())

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from longrag.index.distplan import resolve_links

        src: list[int] = []
        dst: list[int] = []
        for key, code in zip(batch["key"], batch["code"]):
            table = read_part(self.store, key, ["title", "links"])
            pos = part_positions(self.lookup_keys, self.lookup_pos, int(code), table.num_rows)
            for p, title, links in zip(pos.tolist(), table.column("title").to_pylist(), table.column("links").to_pylist()):
                if p >= 0:
                    found = resolve_links(title, links or [], self.keys, self.redirects)
                    src.extend([p] * len(found))
                    dst.extend(found)
        return {"src": np.asarray(src, dtype=np.int64), "dst": np.asarray(dst, dtype=np.int64)}


def resolve_edges(out: str, parts: list[tuple[str, int]], titles: pa.Array, redirects: dict[str, str] | None,
                  lookup: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Stage 2: the link graph as position arrays ``(src, dst)``; ``titles`` in corpus order,
    ``lookup`` the sorted ``(part, row)`` keys and their positions."""
    shared = ray.put((titles, redirects, lookup))
    return collect_edges(over_parts(parts, LinkResolver, store_uri=out, shared=[shared]), len(titles))


# ---------------------------------------------------------------------------------------- 4. assembly
class AttachPlan:
    """Ray Data callable: parts -> document rows with their unit, corpus position and shard."""

    def __init__(self, store_uri: str, shared: list[Any], kind: str, passage_words: int) -> None:
        from longrag.index.artifacts import ArtifactStore

        self.store = ArtifactStore.open(store_uri)
        self.keys, self.pos, self.first_unit, self.shard_of_unit = ray.get(shared[0])
        self.kind, self.passage_words = kind, passage_words

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:

        from longrag.index.units import passage_rows

        out: dict[str, list[Any]] = {c: [] for c in ("shard", "unit", "pos", "doc_id", "title", "text", "n_tokens")}
        for key, code in zip(batch["key"], batch["code"]):
            table = read_part(self.store, key, ["doc_id", "title", "text", "n_tokens"])
            pos = part_positions(self.keys, self.pos, int(code), table.num_rows)
            for r, rec in enumerate(table.to_pylist()):
                p = int(pos[r])
                if p < 0:
                    continue  # a later duplicate of a doc_id
                first = int(self.first_unit[p])
                rows = passage_rows(rec, first, self.passage_words) if self.kind == "passage" else [{**rec, "unit": first}]
                for row in rows:
                    out["shard"].append(int(self.shard_of_unit[row["unit"]]))
                    out["pos"].append(p)
                    for c in ("unit", "doc_id", "title", "text", "n_tokens"):
                        out[c].append(row[c])
        return out


def assemble_shard(group: dict[str, np.ndarray], store_uri: str, kind: str, model: str,
                   passage_words: int) -> dict[str, list[Any]]:
    """Ray Data ``map_groups``: one shard's document rows -> its units, staged in the store;
    returns the shard's unit count and plan digest."""
    from longrag.index.artifacts import ArtifactStore
    from longrag.index.distplan import stage_shard_units
    from longrag.index.manifest import shard_plan
    from longrag.index.units import assemble_units

    shard = int(group["shard"][0])
    cols = ("unit", "pos", "doc_id", "title", "text", "n_tokens")
    rows = [dict(zip(cols, vals)) for vals in zip(*(group[c].tolist() for c in cols))]
    units = assemble_units(kind, rows, _counter(model), passage_words)
    stage_shard_units(ArtifactStore.open(store_uri).storage, shard, units)
    return {"shard": [shard], "n_units": [len(units)], "digest": [shard_plan({shard: units})[str(shard)]],
            "text_bytes": [sum(len(u.text.encode("utf-8")) for u in units)]}


def assemble(out: str, parts: list[tuple[str, int]], keys_sorted: np.ndarray, pos_sorted: np.ndarray,
             plan: UnitPlan, config: LongRAGConfig) -> list[dict[str, Any]]:
    """Stage 4: the plan table to the workers, units assembled and staged per shard."""
    shared = ray.put((keys_sorted, pos_sorted, plan.first_unit, plan.shard_of_unit))
    ds = over_parts(parts, AttachPlan, store_uri=out, shared=[shared], kind=plan.kind,
                    passage_words=config.units.passage_words)
    ds = ds.groupby("shard", num_partitions=plan.n_shards).map_groups(
        assemble_shard, batch_format="numpy",
        fn_kwargs={"store_uri": out, "kind": plan.kind, "model": config.embedding.model,
                   "passage_words": config.units.passage_words})
    rows = [r for b in ds.iter_batches(batch_size=None, batch_format="numpy")
            for r in (dict(zip(b, vals)) for vals in zip(*(b[c].tolist() for c in b)))]
    return sorted(rows, key=lambda r: int(r["shard"]))


# ---------------------------------------------------------------------------------------- the build
def plan_corpus(sources: str | list[str], fmt: str, out: str, config: LongRAGConfig) -> tuple[StagedPlan, dict[str, Any], CorpusArtifact]:
    """Stages 1-4 into the store at ``out``: parsed documents under ``documents/``, each shard's units
    staged. Returns the plan, the read report and the corpus artifact's manifest entry."""
    from longrag.corpus.sources import expand_sources
    from longrag.index.artifacts import ArtifactStore
    from longrag.index.distplan import final_redirects, order_documents
    from longrag.index.graph import unit_graph_from_labels
    from longrag.index.plan import BuildSettings
    from longrag.index.units import plan_units, unit_id

    model_max, max_tokens = chunk_limits(config)
    if fmt != "wikixml" and config.units.text_mode != "full":
        raise ValueError(f"units.text_mode={config.units.text_mode!r} needs sections: it applies to --format wikixml only")
    store = ArtifactStore.open(out)
    for key in store.storage.list(DOCUMENTS_PREFIX):  # an earlier attempt's parts
        store.storage.delete(key)
    clear_staging(store)
    files = expand_sources(sources, fmt)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    meta, reports, n_tasks = read_metadata(files, fmt, out, config)
    timings["parse_s"] = time.perf_counter() - t0
    order, dups = order_documents(meta, fmt)
    redirects = {t: target for r in reports for t, target in r["redirects"]}
    bad = [b for r in reports for b in r["bad"]]
    bad += [{"source": None, "line": None, "title": None, "reason": "duplicate doc_id", "record": d} for _, d in dups]
    read_report: dict[str, Any] = {"sources": files, "fmt": fmt, "read_tasks": n_tasks,
                                   "n_ok": int(order.shape[0]), "n_bad": len(bad), "bad": bad[:20]}
    if fmt == "wikixml":
        read_report.update(pages=sum(r["n_ok"] + len(r["bad"]) for r in reports), redirects=len(redirects))
    if not order.shape[0]:
        raise ValueError(f"no documents could be read from {files} ({read_report})")
    log.info("parsed %d documents (%d bad) in %.1fs", order.shape[0], len(bad), timings["parse_s"])

    # arrival index -> corpus position (-1: dropped duplicate), looked up by (part, row)
    pos_of = np.full(len(meta), -1, dtype=np.int64)
    pos_of[order] = np.arange(order.shape[0], dtype=np.int64)
    keys = row_keys(meta.part, meta.row)
    by_key = np.argsort(keys, kind="stable")
    keys_sorted, pos_sorted = keys[by_key], pos_of[by_key]
    parts = sorted({(k, int(c)) for k, c in ((p["key"], _part_code(r["task"]["task_id"], i))
                                               for r in reports for i, p in enumerate(r["parts"]))})
    sizes = meta.n_tokens[order]
    cfg = config.units
    t0 = time.perf_counter()
    if cfg.kind == "grouped":
        titles = meta.title.take(pa.array(order)).combine_chunks()
        if cfg.links == "hyperlinks":
            src, dst = resolve_edges(out, parts, titles, final_redirects(redirects) if fmt == "wikixml" else None,
                                     (keys_sorted, pos_sorted))
        else:  # a corpus without hyperlinks: title mentions and/or TF-IDF neighbours (actors/distlinks.py)
            src, dst = computed_edges(out, parts, titles, (keys_sorted, pos_sorted), cfg)
        del titles
        read_report["links"] = {"source": cfg.links, "edges": int(src.shape[0])}
    else:
        src = dst = np.zeros(0, dtype=np.int64)
    timings["links_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    counter = _counter(config.embedding.model)
    plan = plan_units(cfg.kind, sizes, src, dst, separator_tokens=counter.count("\n\n"), budget=cfg.max_group_tokens,
                      symmetric=cfg.symmetric_links, n_shards=config.index.shards,
                      passage_tokens=[meta.passage_tokens[i] for i in order.tolist()] if cfg.kind == "passage" else None)
    timings["group_s"] = time.perf_counter() - t0
    log.info("grouped %d documents into %d %s units in %.1fs", order.shape[0], plan.n_units, cfg.kind, timings["group_s"])
    t0 = time.perf_counter()
    shards = assemble(out, parts, keys_sorted, pos_sorted, plan, config)
    timings["assemble_s"] = time.perf_counter() - t0
    if [int(r["shard"]) for r in shards] != list(range(plan.n_shards)):
        raise RuntimeError(f"assembly returned shards {[int(r['shard']) for r in shards]}, planned {plan.n_shards}")
    grouping = plan.stats()
    grouping["text_bytes"] = int(sum(int(r["text_bytes"]) for r in shards))
    staged = StagedPlan(
        config=config, settings=BuildSettings.of(config), documents=int(order.shape[0]),
        shard_units={int(r["shard"]): int(r["n_units"]) for r in shards},
        digests={str(int(r["shard"])): str(r["digest"]) for r in shards},
        model_max=model_max, max_tokens=max_tokens, grouping=grouping, group_s=timings["group_s"],
        graph=unit_graph_from_labels([unit_id(cfg.kind, i) for i in range(plan.n_units)], plan.shard_of_unit,
                                     plan.first_unit, src, dst))
    corpus = CorpusArtifact(sources=files, fmt=fmt, text_mode=cfg.text_mode, read_tasks=n_tasks,
                            documents=int(order.shape[0]),
                            parts=[CorpusPart(**p) for r in reports for p in r["parts"]])
    read_report["timings_s"] = timings
    return staged, read_report, corpus


def build_corpus_index(sources: str | list[str], fmt: str, out: str, config: LongRAGConfig, *,
                       overwrite: bool = False, resume: bool = False, command: list[str] | None = None) -> dict[str, Any]:
    """Read, plan, chunk, embed and shard ``sources`` into a build at ``out``; returns the build report.
    With ``resume``, shards of the interrupted build whose units and files still match are kept."""
    t_all = time.perf_counter()
    store = open_out(out, overwrite=overwrite, resume=resume)
    plan, read_report, corpus = plan_corpus(sources, fmt, out, config)
    timings = read_report.pop("timings_s")
    return build_planned(store, out, config, plan, read_report=read_report,
                         timings=timings, started_at=t_all, resume=resume, command=command, corpus=corpus)


def ensure_sample_build(out: str, say: Any = print) -> str:
    """The bundled enwiki sample's build at ``out`` (the demo's settings: grouped lead units, 2
    shards), built first when ``out`` holds none (or one from before the shards' BM25 index or the
    unit graph); benchmarks serve it."""
    from longrag.config import load_config
    from longrag.data import SAMPLE_WIKI, data_path
    from longrag.index.artifacts import ArtifactStore
    from longrag.index.graph import GRAPH_FILE
    from longrag.index.lexical import lexical_missing

    try:
        manifest = ArtifactStore.open(out).read_manifest()
        if not lexical_missing(manifest) and GRAPH_FILE in manifest.artifacts:
            return out
        say(f"{out} predates the shards' BM25 index or the unit graph: indexing the bundled sample again")
    except Exception:  # no build there yet: make it
        say(f"indexing the bundled sample into {out}")
    config = load_config(None, ["units.kind=grouped", "units.text_mode=lead", "index.shards=2"])
    build_corpus_index(str(data_path(SAMPLE_WIKI)), "wikixml", out, config, overwrite=True,
                       command=["python", "-m", "jobs.bench", "serve"])
    return out
