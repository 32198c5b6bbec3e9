"""The local retrieval of an evaluation run, on Ray: build or reuse each setting's index
(:mod:`actors.build`), encode the questions (in the driver, or a Ray Data pool of query encoders for
many questions) and search the build's shard deployments through the service's scatter/gather
(``open_index``, given by the job: :func:`serve.index_app.open_index`, the same Serve application the
Retriever uses).

Query encoding: ``encode="auto"`` encodes in the driver for up to ``DRIVER_ENCODE_MAX`` questions
(one model load, no actor start-up: a few hundred questions take well under a second once the model
is loaded) and with a Ray Data ``map_batches`` pool of query-encoder actors above that (spread over
the cluster's CPUs/GPUs: ``actors.embedding.pool_options``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from longrag.config import LongRAGConfig
from longrag.eval import pipeline as P
from longrag.eval.links import link_stats
from longrag.eval.plan import FINGERPRINT_FILE, EvalRun, EvalSetting, file_digest, index_fingerprint, index_uri
from longrag.eval.run import add_links
from longrag.index.artifacts import ArtifactStore, require_unit_graph
from longrag.index.fusion import Fusion
from longrag.index.graph import GRAPH_FILE, GraphExpansion, expand, split_mode
from longrag.index.lexical import lexical_missing
from longrag.index.plan import BuildSettings, ResumeError
from longrag.progress import progress as progress_bar
from longrag.types import Document

#: ``open_index(build_uri, index_config)``: the build's shards for a job's searches.
OpenIndex = Callable[[str, Any], AbstractContextManager[Any]]

log = logging.getLogger(__name__)

DRIVER_ENCODE_MAX = 2000
SEARCH_BATCH = 32


def ensure_index(run: EvalRun, setting: EvalSetting, docs: list[Document], corpus_files: list[str]) -> dict[str, Any]:
    """Reuse a complete build with the same fingerprint, or build one (resuming an unfinished build
    at the same place); returns index info."""
    from actors.build import build_from_documents

    ev = run.eval
    cfg = run.config_for(setting.unit)
    digests = [file_digest(f) for f in corpus_files]
    extra = {"dataset": ev.dataset, "pool": ev.pool, "limit": ev.limit if ev.pool == "selected" else None}
    fp, parts = index_fingerprint(digests, BuildSettings.of(cfg), links=setting.links, extra=extra)
    uri = index_uri(ev.index_dir, ev.dataset, setting, fp)
    store = ArtifactStore.open(uri)
    status = store.status()
    info: dict[str, Any] = {"uri": uri, "fingerprint": fp, "fingerprint_parts": parts, "corpus_files": digests}
    if status == "complete" and not ev.rebuild_index:
        stored = json.loads(store.storage.read_bytes(FINGERPRINT_FILE)) if store.storage.exists(FINGERPRINT_FILE) else {}
        manifest = store.read_manifest()
        if stored.get("fingerprint") == fp and not lexical_missing(manifest) and GRAPH_FILE in manifest.artifacts:
            log.info("reusing index %s (build %s, fingerprint %s)", uri, manifest.build_id, fp[:12])
            report = json.loads(store.storage.read_bytes("build_report.json")) if store.storage.exists("build_report.json") else {}
            return {**info, "reused": True, "build_id": manifest.build_id, "build_report": report, "build_s": 0.0}
        log.warning("%s is complete but its fingerprint differs or is missing, or it predates the shards' BM25 "
                    "index or the unit graph: rebuilding", uri)
    link_tag = setting.links if setting.unit == "grouped" else "nolinks"
    log.info("building index %s (%d documents, %s units, links=%s)", uri, len(docs), setting.unit, link_tag)
    t0 = time.perf_counter()
    docs = add_links(docs, setting.links) if setting.unit == "grouped" else docs
    read_report = {"n_ok": len(docs), "n_bad": 0, "links": link_stats(docs)}
    report = None
    if status == "building" and not ev.rebuild_index:
        # Same fingerprint (path): finish the interrupted build, keeping its verified shards.
        try:
            report = build_from_documents(docs, uri, cfg, read_report=read_report, resume=True, command=run.command)
            log.info("resumed the unfinished build at %s: %s", uri, report.get("resume"))
        except ResumeError as exc:
            log.warning("%s holds an unfinished build that cannot be resumed (%s): rebuilding", uri, exc)
    if report is None:
        report = build_from_documents(docs, uri, cfg, read_report=read_report,
                                      overwrite=store.status() != "absent", command=run.command)
    store.storage.write_bytes(FINGERPRINT_FILE, json.dumps({"fingerprint": fp, "parts": parts}, indent=2).encode())
    build_s = time.perf_counter() - t0
    log.info("built index %s in %.1fs: %s", uri, build_s, report.get("counts"))
    return {**info, "reused": False, "build_id": report["build_id"], "build_report": report, "build_s": round(build_s, 2)}


def encode_queries(questions: list[str], config: LongRAGConfig, mode: str) -> tuple[np.ndarray, str]:
    """``(n, dim)`` float32 query vectors, in question order, and the mode used."""
    if mode == "auto":
        mode = "driver" if len(questions) <= DRIVER_ENCODE_MAX else "ray-data"
    emb = config.embedding
    if mode == "driver":
        from longrag.index.embedding import Embedder

        vecs = Embedder(emb).encode_queries(questions)
    elif mode == "ray-data":
        import ray

        from actors.embedding import embed

        ds = ray.data.from_items(
            [{"i": i, "question": q} for i, q in enumerate(questions)],
            override_num_blocks=max(1, min(len(questions) // emb.batch_size, 64)),
        )
        ds = embed(ds, emb, role="query", column="question")
        rows = sorted(ds.take_all(), key=lambda r: int(r["i"]))
        if [int(r["i"]) for r in rows] != list(range(len(questions))):
            raise RuntimeError("Ray Data returned a different set of questions than it was given")
        vecs = np.stack([np.asarray(r["vector"], dtype=np.float32) for r in rows])
    else:
        raise ValueError(f"unknown encode mode {mode!r} (choose from auto, driver, ray-data)")
    vecs = np.ascontiguousarray(vecs, dtype=np.float32)
    if vecs.ndim != 2 or vecs.shape[0] != len(questions):
        raise RuntimeError(f"query vectors have shape {vecs.shape}, expected ({len(questions)}, dim)")
    return vecs, mode


def retrieve_local(
    index_uri: str, questions: list[str], k: int, config: LongRAGConfig, encode_mode: str, progress: bool,
    open_index: OpenIndex,
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """Top-k units per question through the build's shard deployments (``retrieval.mode`` dense,
    hybrid, graph or hybrid+graph); returns (retrieved lists, stats)."""
    hybrid, graph = split_mode(config.retrieval.mode)
    expansion = GraphExpansion.of(config.retrieval) if graph else None
    unit_graph = require_unit_graph(ArtifactStore.open(index_uri)) if graph else None
    evidence = config.retrieval.scores_chunks
    t0 = time.perf_counter()
    vecs, used_mode = encode_queries(questions, config, encode_mode)
    encode_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    with open_index(index_uri, _search_config(config)) as index:
        load_s = time.perf_counter() - t1
        out: list[list[dict[str, Any]]] = []
        degraded = 0
        graph_s = 0.0
        t2 = time.perf_counter()
        bar = progress_bar(len(questions), "retrieve", bar=progress, logger=log)
        for start in range(0, len(questions), SEARCH_BATCH):
            batch = vecs[start : start + SEARCH_BATCH]
            texts = questions[start : start + len(batch)] if hybrid else None
            res = index.search_sync(batch, expansion.first_stage_k(k) if expansion else k, texts,
                                    Fusion.of(config.retrieval))
            if res.coverage.degraded:
                degraded += 1
                log.warning("search batch at %d was degraded: %s", start, res.coverage.to_dict())
            if expansion is not None:
                tg = time.perf_counter()
                res.hits = [expand(hs, unit_graph, k, expansion) for hs in res.hits]
                graph_s += time.perf_counter() - tg
            if evidence or graph:
                # A unit's document order (and a graph-found unit's best chunk) is its question's:
                # fetched per question (two questions of a batch may retrieve the same unit, and the
                # rows are keyed by unit).
                for q, hs in enumerate(res.hits):
                    vec = vecs[start + q][None, :]
                    rows = index.fetch_units_sync(hs, np.repeat(vec, len(hs), 0), evidence)
                    out.append(P.retrieved_from_hits(hs, rows))
            else:
                rows = index.fetch_units_sync([h for hs in res.hits for h in hs])
                out.extend(P.retrieved_from_hits(hs, rows) for hs in res.hits)
            bar.update(len(res.hits))
        bar.close()
        search_s = time.perf_counter() - t2
        counts = index.manifest.counts
    stats = {
        "mode": config.retrieval.mode,
        "encode_mode": used_mode,
        "encode_s": round(encode_s, 3),
        "shard_load_s": round(load_s, 3),
        "search_fetch_s": round(search_s, 3),
        "degraded_batches": degraded,
        **({"graph_s": round(graph_s, 3), "graph_links": unit_graph.n_links} if unit_graph is not None else {}),
        "shards": index.n_shards,
        "corpus_units": counts.units,
        "corpus_chunks": counts.chunks,
    }
    return out, stats


def _search_config(config: LongRAGConfig) -> Any:
    """The ``index`` section for a job's own searches: batches of questions may take longer than one request's."""
    return config.index.model_copy(update={"search_timeout_s": max(config.index.search_timeout_s, 30.0)})


def iterate_local(
    index_uri: str, questions: list[str], k: int, config: LongRAGConfig, progress: bool, open_index: OpenIndex,
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """``retrieval.mode=iterative``: every question through :func:`longrag.retrieval.hops.iterate` over
    the build's shard deployments, the query encoder and the LLM in this driver."""
    import asyncio

    from longrag.index.embedding import Embedder
    from longrag.llm.factory import build_llm
    from longrag.retrieval.hops import iterate

    r = config.retrieval
    t0 = time.perf_counter()
    embedder, llm = Embedder(config.embedding), build_llm(config.llm)
    degraded = 0

    async def search(query: str, n: int) -> list[Any]:
        nonlocal degraded
        vec = embedder.encode_queries([query])
        res = await index.search(vec, n)
        degraded += bool(res.coverage.degraded)
        return await index.retrieve_units(res.hits[0], vec[0] if r.scores_chunks else None)

    async def run_all() -> list[Any]:
        bar = progress_bar(len(questions), "retrieve (iterative)", bar=progress, logger=log)
        out = []
        for q in questions:
            out.append(await iterate(q, k, search, llm, max_hops=r.max_hops, evidence_units=r.evidence_units,
                                     bridge_max_tokens=r.bridge_max_tokens))
            bar.update(1)
        bar.close()
        return out

    try:
        with open_index(index_uri, _search_config(config)) as index:
            load_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            results = asyncio.run(run_all())
            search_s = time.perf_counter() - t1
    finally:
        getattr(llm, "close", lambda: None)()
    hops = [len(res.hops) for res in results]
    stats = {
        "mode": "iterative", "max_hops": r.max_hops, "shard_load_s": round(load_s, 3),
        "search_fetch_s": round(search_s, 3), "degraded_searches": degraded,
        "llm_s": round(sum(h.llm_ms for res in results for h in res.hops) / 1e3, 3),
        "hops_per_question": {n: hops.count(n) for n in sorted(set(hops))},
        "stopped": {w: sum(1 for res in results if res.hops[-1].stopped == w)
                    for w in sorted({res.hops[-1].stopped or "" for res in results})},
        "bridges": [[h.bridge for h in res.hops[1:]] for res in results],
        "shards": index.n_shards,
        "corpus_units": index.manifest.counts.units,
    }
    return [P.retrieved_from_units(res.units) for res in results], stats


class LocalRetrieval:
    """:class:`longrag.eval.run.UnitSource` over a local (or ``s3://``) index built on the connected Ray
    cluster, searched through ``open_index(build_uri, index_config)`` (a context manager yielding a
    :class:`actors.sharded_index.ShardedIndex`: :func:`serve.index_app.open_index`)."""

    def __init__(self, open_index: OpenIndex) -> None:
        self.open_index = open_index

    def retrieve(self, run: EvalRun, setting: EvalSetting, docs: list[Document], corpus_files: list[str],
                 questions: list[str], k: int) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
        index = ensure_index(run, setting, docs, corpus_files)
        config = run.config_for(setting.unit)
        if config.retrieval.mode == "iterative":
            retrieved, stats = iterate_local(index["uri"], questions, k, config, run.eval.progress, self.open_index)
        else:
            retrieved, stats = retrieve_local(index["uri"], questions, k, config, run.eval.encode, run.eval.progress,
                                              self.open_index)
        return retrieved, {"index": index, "retrieval": stats}
