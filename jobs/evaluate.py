"""Evaluate retrieval (and the long reader) on a QA set: one command, offline, reproducible.

    python -m jobs.evaluate --dataset hotpotqa --data data/hotpotqa/hotpotqa_train100.json.gz \
        --unit grouped,document,passage --links titles --k 1,2,4,8 --pipeline retrieve --out reports/hotpot

    python -m jobs.evaluate --dataset musique --data data/musique/musique_train100.json.gz \
        --unit grouped --links titles --pipeline longrag --reader-k 4 --limit 20 --out reports/musique-qa

Steps: load the questions; pool the context paragraphs of every question of the set into one corpus
(or read ``--corpus``); add links (title mentions, TF-IDF neighbours, or the documents' own); build
the index with ``jobs.index.build_from_documents`` -- or reuse a complete build whose fingerprint
(corpus content, unit kind, links, embedding/units/chunking/index config) matches; encode the
questions; search the ``ShardedIndex`` actors (the service's scatter/gather); run the
``LongReader`` over the top ``--reader-k`` units unless ``--pipeline retrieve``; write
``metrics.json``, ``predictions.jsonl``, ``report.md`` and PNG plots. With ``--endpoint URL`` the
questions go to a running Serve app instead (``/v1/retrieve``, ``/v1/answer``) and no index is built.

Several ``--unit`` (and ``--links``) values, comma-separated, run one setting each (written under
``OUT/<setting>/``) and a combined report in ``OUT`` (the unit-granularity comparison of LongRAG,
Jiang et al., 2024, "LongRAG: Enhancing Retrieval-Augmented Generation with Long-context LLMs",
Section 4.2, Tables 1-2, and Section 4.3, Figures 3-5). ``--combine RUN_DIR ...`` combines runs
written earlier.

Query encoding: ``--encode auto`` encodes in the driver for up to ``DRIVER_ENCODE_MAX`` questions
(one model load, no actor start-up, no data-pipeline overhead: a few hundred questions take well
under a second once the model is loaded) and with a Ray Data ``map_batches`` pool of query-encoder
actors above that (spread over the cluster's CPUs/GPUs with ``embedding.concurrency/num_gpus``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from longrag.cli import int_list, number
from longrag.config import LongRAGConfig, load_config
from longrag.eval import pipeline as P
from longrag.eval.corpus import PooledCorpus, load_corpus_file, load_dpr_passages, pool_examples
from longrag.eval.datasets import QAExample, load_qa
from longrag.eval.links import build_links, link_stats
from longrag.eval.report import score_results, summarize
from longrag.eval.checkpoint import ReaderCheckpoint
from longrag.eval.runs import combine, write_run
from longrag.progress import progress as progress_bar
from longrag.types import Document, Unit

log = logging.getLogger("jobs.evaluate")

DATASET_FORMATS = {"hotpotqa": "hotpotqa", "musique": "musique", "2wiki": "2wiki", "nq": "nq_open", "longbench": "longbench"}
LINK_METHODS = {"titles": "title_mentions", "tfidf": "tfidf", "both": "both"}
DRIVER_ENCODE_MAX = 2000
SEARCH_BATCH = 32
FINGERPRINT_FILE = "eval_fingerprint.json"


# ---------------------------------------------------------------------------------------- data
def load_examples(dataset: str, data: str, limit: int | None) -> tuple[list[QAExample], list[QAExample], dict[str, Any]]:
    """(questions to evaluate, all questions of the file, load info)."""
    loaded = load_qa(data, DATASET_FORMATS[dataset])
    if not loaded.examples:
        raise ValueError(f"{data}: no {dataset} questions could be read ({loaded.errors[:3]})")
    all_ex = loaded.examples
    chosen = all_ex[:limit] if limit else all_ex
    info = {"source": data, "format": loaded.format, "records": loaded.n_records, "malformed": loaded.n_malformed}
    return chosen, all_ex, info


def corpus_documents(
    dataset: str, data: str, corpus: str | None, pool_scope: str | int, chosen: list[QAExample],
    all_ex: list[QAExample],
) -> tuple[list[Document], list[str], dict[str, Any]]:
    """Documents to index, the files they came from, and pooling stats."""
    if isinstance(pool_scope, int):
        if pool_scope < len(chosen):
            raise ValueError(f"--pool {pool_scope} pools fewer questions than the {len(chosen)} evaluated")
        pooled_ex = all_ex[:pool_scope]
    else:
        pooled_ex = chosen if pool_scope == "selected" else all_ex
    if corpus:
        with open(corpus, "rb") as fh:
            head = fh.read(4096).lstrip()
        pooled: PooledCorpus = load_dpr_passages(corpus) if b'"contents"' in head else load_corpus_file(corpus)
        files = [corpus]
    elif dataset == "longbench":
        # Each LongBench record carries its own long context: one document per record.
        docs = [
            Document(doc_id=f"lb{i}", title=f"context {ex.qid}", text=str(ex.meta.get("context", "")))
            for i, ex in enumerate(pooled_ex)
        ]
        return docs, [data], {"documents": len(docs), "policy": "one document per record"}
    elif dataset == "nq":
        raise ValueError("--dataset nq has no context paragraphs: pass --corpus (e.g. DPR passages JSONL)")
    else:
        pooled = pool_examples(pooled_ex)
        files = [data]
    if not pooled.documents:
        raise ValueError(f"the corpus is empty ({pooled.errors[:3]})")
    return pooled.documents, files, pooled.stats()


def add_links(docs: list[Document], links: str) -> list[Document]:
    """``hyperlinks`` keeps the documents' own links; ``titles``/``tfidf``/``both`` build them."""
    if links == "hyperlinks":
        if not any(d.links for d in docs):
            log.warning("--links hyperlinks: no document has links, so every grouped unit is one document")
        return docs
    return build_links(docs, LINK_METHODS[links])


# ---------------------------------------------------------------------------------------- index
def ensure_index(
    docs: list[Document],
    corpus_files: list[str],
    *,
    unit: str,
    links: str,
    config: LongRAGConfig,
    index_root: str,
    dataset: str,
    extra: dict[str, Any],
    command: list[str],
    rebuild: bool = False,
) -> dict[str, Any]:
    """Reuse a complete build with the same fingerprint, or build one; returns index info."""
    from jobs.index import ResumeError, build_from_documents
    from longrag.store import ArtifactStore

    digests = [P.file_digest(f) for f in corpus_files]
    cfg = config.model_copy(deep=True)
    cfg.units.kind = unit
    fp, parts = P.index_fingerprint(digests, unit=unit, links=links, config=cfg.model_dump(), extra=extra)
    link_tag = links if unit == "grouped" else "nolinks"
    uri = f"{index_root.rstrip('/')}/{dataset}-{unit}-{link_tag}-{fp[:12]}"
    store = ArtifactStore.open(uri)
    status = store.status()
    info: dict[str, Any] = {"uri": uri, "fingerprint": fp, "fingerprint_parts": parts, "corpus_files": digests}
    if status == "complete" and not rebuild:
        stored = json.loads(store.storage.read_bytes(FINGERPRINT_FILE)) if store.storage.exists(FINGERPRINT_FILE) else {}
        if stored.get("fingerprint") == fp:
            manifest = store.read_manifest()
            log.info("reusing index %s (build %s, fingerprint %s)", uri, manifest.build_id, fp[:12])
            report = json.loads(store.storage.read_bytes("build_report.json")) if store.storage.exists("build_report.json") else {}
            return {**info, "reused": True, "build_id": manifest.build_id, "build_report": report, "build_s": 0.0}
        log.warning("%s is complete but its fingerprint differs or is missing: rebuilding", uri)
    log.info("building index %s (%d documents, %s units, links=%s)", uri, len(docs), unit, link_tag)
    t0 = time.perf_counter()
    docs = add_links(docs, links) if unit == "grouped" else docs
    read_report = {"n_ok": len(docs), "n_bad": 0, "links": link_stats(docs)}
    report = None
    if status == "building" and not rebuild:
        # Same fingerprint (path): finish the interrupted build, keeping its verified shards.
        try:
            report = build_from_documents(docs, uri, cfg, read_report=read_report, resume=True, command=command)
            log.info("resumed the unfinished build at %s: %s", uri, report.get("resume"))
        except ResumeError as exc:
            log.warning("%s holds an unfinished build that cannot be resumed (%s): rebuilding", uri, exc)
    if report is None:
        report = build_from_documents(docs, uri, cfg, read_report=read_report,
                                      overwrite=store.status() != "absent", command=command)
    store.storage.write_bytes(FINGERPRINT_FILE, json.dumps({"fingerprint": fp, "parts": parts}, indent=2).encode())
    build_s = time.perf_counter() - t0
    log.info("built index %s in %.1fs: %s", uri, build_s, report.get("counts"))
    return {**info, "reused": False, "build_id": report["build_id"], "build_report": report, "build_s": round(build_s, 2)}


# ---------------------------------------------------------------------------------------- retrieval
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

        ds = ray.data.from_items(
            [{"i": i, "question": q} for i, q in enumerate(questions)],
            override_num_blocks=max(1, min(len(questions) // emb.batch_size, 64)),
        )
        from actors.embedding import ChunkEmbedder

        ds = ds.map_batches(
            ChunkEmbedder,
            fn_constructor_kwargs={"embedding_config": emb.model_dump(), "role": "query", "column": "question"},
            batch_size=emb.batch_size,
            concurrency=emb.concurrency,
            num_cpus=emb.num_cpus,
            num_gpus=emb.num_gpus,
        )
        rows = sorted(ds.take_all(), key=lambda r: int(r["i"]))
        if [int(r["i"]) for r in rows] != list(range(len(questions))):
            raise RuntimeError("Ray Data returned a different set of questions than it was given")
        vecs = np.stack([np.asarray(r["vector"], dtype=np.float32) for r in rows])
    else:
        raise ValueError(f"unknown encode mode {mode!r}")
    vecs = np.ascontiguousarray(vecs, dtype=np.float32)
    if vecs.ndim != 2 or vecs.shape[0] != len(questions):
        raise RuntimeError(f"query vectors have shape {vecs.shape}, expected ({len(questions)}, dim)")
    return vecs, mode


def retrieve_local(
    index_uri: str, questions: list[str], k: int, config: LongRAGConfig, encode_mode: str, progress: bool
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """Top-k units per question through ShardedIndex actors; returns (retrieved lists, stats)."""
    from actors.sharded_index import ShardedIndex

    t0 = time.perf_counter()
    vecs, used_mode = encode_queries(questions, config, encode_mode)
    encode_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    index = ShardedIndex.launch(
        index_uri,
        replicas=config.index.replicas,
        num_cpus=config.index.shard_num_cpus,
        timeout_s=max(config.index.search_timeout_s, 30.0),
        search_params=config.index.search_params,
        threads=config.index.shard_threads,
    )
    try:
        infos = index.wait_ready()
        load_s = time.perf_counter() - t1
        out: list[list[dict[str, Any]]] = []
        degraded = 0
        t2 = time.perf_counter()
        bar = progress_bar(len(questions), "retrieve", bar=progress, logger=log)
        for start in range(0, len(questions), SEARCH_BATCH):
            res = index.search_sync(vecs[start : start + SEARCH_BATCH], k)
            if res.coverage.degraded:
                degraded += 1
                log.warning("search batch at %d was degraded: %s", start, res.coverage.to_dict())
            rows = index.fetch_units_sync([h for hs in res.hits for h in hs])
            out.extend(P.retrieved_from_hits(hs, rows) for hs in res.hits)
            bar.update(len(res.hits))
        bar.close()
        search_s = time.perf_counter() - t2
    finally:
        index.kill()
    stats = {
        "encode_mode": used_mode,
        "encode_s": round(encode_s, 3),
        "shard_load_s": round(load_s, 3),
        "search_fetch_s": round(search_s, 3),
        "degraded_batches": degraded,
        "shards": len(infos),
        "corpus_units": int(sum(i["n_units"] for i in infos)) // max(1, config.index.replicas),
        "corpus_chunks": int(sum(i["n_chunks"] for i in infos)) // max(1, config.index.replicas),
    }
    return out, stats


def _post(client: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(url, json=body)
    if resp.status_code != 200:
        raise RuntimeError(f"POST {url} -> HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.json()


def retrieve_endpoint(
    endpoint: str, questions: list[str], k: int, doc_texts: dict[str, str] | None, progress: bool, timeout_s: float
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """Top-k units per question from a running Serve app (``POST {endpoint}/v1/retrieve``)."""
    import httpx

    out = []
    t0 = time.perf_counter()
    degraded = 0
    with httpx.Client(timeout=timeout_s) as client:
        bar = progress_bar(len(questions), "retrieve (http)", bar=progress, logger=log)
        for q in questions:
            body = _post(client, f"{endpoint.rstrip('/')}/v1/retrieve", {"question": q, "k": k})
            degraded += bool((body.get("coverage") or {}).get("degraded"))
            out.append(P.retrieved_from_endpoint(body["units"], doc_texts))
            bar.update(1)
        bar.close()
    return out, {"endpoint": endpoint, "search_fetch_s": round(time.perf_counter() - t0, 3), "degraded_requests": degraded}


# ---------------------------------------------------------------------------------------- reader
def reader_setup(config: LongRAGConfig, reader_k: int) -> dict[str, Any]:
    """What decides a local reader's answers (the key of its checkpoint entries)."""
    return {"llm": config.llm.model_dump(), "reader": config.reader.model_dump(), "reader_k": reader_k}


def checkpoint_file(out: str | Path, label: str) -> Path:
    """Where a setting's reader answers are checkpointed while its run is in progress."""
    return Path(out) / f".reader-checkpoint-{label}.jsonl"


def _from_checkpoint(results: list[dict[str, Any]], reader_k: int,
                     checkpoint: ReaderCheckpoint | None) -> list[dict[str, Any]]:
    """Attach the answers the checkpoint already holds; return the results still to read."""
    if checkpoint is None:
        return results
    todo = []
    for r in results:
        done = checkpoint.get(r["qid"], r["question"], [u["unit_id"] for u in r["retrieved"][:reader_k]])
        if done is None:
            todo.append(r)
        else:
            P.attach_reader(r, done)
    if len(todo) < len(results):
        log.info("reader checkpoint %s: %d of %d answers reused, %d to read", checkpoint.path,
                 len(results) - len(todo), len(results), len(todo))
    return todo


def run_reader_local(
    results: list[dict[str, Any]], config: LongRAGConfig, reader_k: int, concurrency: int, progress: bool,
    checkpoint_path: Path | None = None,
) -> dict[str, Any]:
    """LongReader over the top ``reader_k`` retrieved units of every result (in place). With
    ``checkpoint_path``, answers are appended there as they come and reused by a rerun."""
    from functools import partial

    from longrag.llm.factory import build_llm
    from longrag.reading.longcontext import compress_units_with_mixpr
    from longrag.reading.reader import LongReader

    checkpoint = ReaderCheckpoint(checkpoint_path, reader_setup(config, reader_k)) if checkpoint_path else None
    todo = _from_checkpoint(results, reader_k, checkpoint)
    t0 = time.perf_counter()
    llm = build_llm(config.llm) if todo else None
    load_s = time.perf_counter() - t0
    # reader.compression=mixpr squeezes units that overflow the window with MixPR (as the Serve Reader)
    compressor = partial(compress_units_with_mixpr, cfg=config.mixpr)
    reader = LongReader(llm, config.reader, compressor=compressor) if llm is not None else None

    async def run_all() -> None:
        sem = asyncio.Semaphore(max(1, concurrency))
        bar = progress_bar(len(todo), "read", bar=progress, logger=log)

        async def one(r: dict[str, Any]) -> None:
            units = [
                Unit(unit_id=u["unit_id"], doc_ids=u.get("doc_ids", []), titles=u["titles"], text=u["text"],
                     n_tokens=u["n_tokens"])
                for u in r["retrieved"][:reader_k]
            ]
            async with sem:
                res = await reader.read(r["question"], units)
            out = res.to_dict()
            P.attach_reader(r, out)
            if checkpoint is not None:
                checkpoint.add(r["qid"], r["question"], [u.unit_id for u in units], out)
            bar.update(1)

        await asyncio.gather(*(one(r) for r in todo))
        bar.close()

    t1 = time.perf_counter()
    if todo:
        asyncio.run(run_all())
    return {"llm": getattr(llm, "name", config.llm.model), "llm_load_s": round(load_s, 2),
            "read_s": round(time.perf_counter() - t1, 2), "from_checkpoint": len(results) - len(todo)}


def run_reader_endpoint(
    results: list[dict[str, Any]], endpoint: str, reader_k: int, progress: bool, timeout_s: float,
    checkpoint_path: Path | None = None,
) -> dict[str, Any]:
    """``POST {endpoint}/v1/answer`` with ``k = reader_k`` for every result (in place), with the
    same checkpointing as :func:`run_reader_local`."""
    import httpx

    checkpoint = None
    if checkpoint_path is not None:
        checkpoint = ReaderCheckpoint(checkpoint_path, {"endpoint": endpoint, "reader_k": reader_k})
    todo = _from_checkpoint(results, reader_k, checkpoint)
    t0 = time.perf_counter()
    with httpx.Client(timeout=timeout_s) as client:
        bar = progress_bar(len(todo), "answer (http)", bar=progress, logger=log)
        for r in todo:
            body = _post(client, f"{endpoint.rstrip('/')}/v1/answer", {"question": r["question"], "k": reader_k})
            trace = body.get("trace") or {}
            out = {
                "answer": body["answer"],
                "long_answer": body.get("long_answer", ""),
                "units_used": [e["unit_id"] for e in body.get("evidence", []) if e.get("used")],
                "prompt_tokens": trace.get("prompt_tokens"),
                "completion_tokens": trace.get("completion_tokens"),
                "truncated": trace.get("context_truncated"),
                "stages_ms": {"total": trace["read_ms"]} if "read_ms" in trace else {},
            }
            P.attach_reader(r, out)
            if checkpoint is not None:
                checkpoint.add(r["qid"], r["question"], [u["unit_id"] for u in r["retrieved"][:reader_k]], out)
            bar.update(1)
        bar.close()
    return {"read_s": round(time.perf_counter() - t0, 2), "from_checkpoint": len(results) - len(todo)}


# ---------------------------------------------------------------------------------------- one setting
def run_setting(
    args: argparse.Namespace,
    config: LongRAGConfig,
    *,
    unit: str,
    links: str,
    label: str,
    chosen: list[QAExample],
    docs: list[Document],
    corpus_files: list[str],
    corpus_info: dict[str, Any],
    command: list[str],
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Retrieve (and read) for one unit kind / link source; returns (scored results, flat metrics, info)."""
    ks = args.ks
    k_max = max(max(ks), args.reader_k if args.pipeline == "longrag" else 1)
    questions = [ex.question for ex in chosen]
    info: dict[str, Any] = {"unit": unit, "links": links, "label": label}
    t0 = time.perf_counter()
    if args.endpoint:
        doc_texts = None
        if unit != "passage":
            from longrag.index.grouping import document_text

            doc_texts = {d.doc_id: document_text(d) for d in docs}
        retrieved, info["retrieval"] = retrieve_endpoint(
            args.endpoint, questions, k_max, doc_texts, not args.no_progress, args.http_timeout
        )
    else:
        extra = {"dataset": args.dataset, "pool": args.pool, "limit": args.limit if args.pool == "selected" else None}
        info["index"] = ensure_index(
            docs, corpus_files, unit=unit, links=links, config=config, index_root=args.index_dir,
            dataset=args.dataset, extra=extra, command=command, rebuild=args.rebuild_index,
        )
        cfg = config.model_copy(deep=True)
        cfg.units.kind = unit
        retrieved, info["retrieval"] = retrieve_local(
            info["index"]["uri"], questions, k_max, cfg, args.encode, not args.no_progress
        )
    # per-question retrieval cost: query encoding + search + unit fetch (not index build or shard load)
    retrieval_s = info["retrieval"].get("encode_s", 0.0) + info["retrieval"]["search_fetch_s"]
    reader_k = args.reader_k if args.pipeline == "longrag" else None
    results = []
    for ex, ret in zip(chosen, retrieved):
        r = P.base_result(ex, label, reader_k)
        r["retrieved"] = ret
        r["retrieval_s"] = retrieval_s / max(1, len(chosen))
        results.append(r)
    if args.pipeline == "longrag":
        ckpt = checkpoint_file(args.out, label)
        if args.endpoint:
            info["reader"] = run_reader_endpoint(results, args.endpoint, args.reader_k, not args.no_progress,
                                                 args.http_timeout, checkpoint_path=ckpt)
        else:
            info["reader"] = run_reader_local(results, config, args.reader_k, args.reader_concurrency,
                                              not args.no_progress, checkpoint_path=ckpt)
    ar_types = None if args.answer_recall_all_types else P.DEFAULT_ANSWER_RECALL_TYPES.get(args.dataset)
    # each dataset's own F1 rule (LongBench: plain token F1, not HotpotQA's yes/no rule)
    scored = score_results(results, ks=ks, answer_recall_types=ar_types, f1_metric=P.qa_f1_metric(args.dataset))
    flat = P.flat_metrics(scored, summarize(scored), dataset=args.dataset, unit=unit, reader_k=reader_k)
    flat["label"] = label
    flat["links"] = links if unit == "grouped" else None
    counts = ((info.get("index") or {}).get("build_report") or {}).get("counts") or {}
    flat["corpus_documents"] = counts.get("documents", len(docs))
    flat["corpus_units"] = counts.get("units", (info.get("retrieval") or {}).get("corpus_units"))
    grouping = ((info.get("index") or {}).get("build_report") or {}).get("grouping") or {}
    flat["corpus_avg_unit_tokens"] = (grouping.get("tokens") or {}).get("mean")
    flat["answer_recall_types"] = list(ar_types) if ar_types else "all"
    flat["qa_f1_rule"] = P.qa_f1_rule(args.dataset)
    info["wall_s"] = round(time.perf_counter() - t0, 2)
    return scored, flat, info


# ---------------------------------------------------------------------------------------- writing
def _provenance(args: argparse.Namespace, command: list[str], data_info: dict[str, Any]) -> dict[str, Any]:
    from longrag.index.manifest import collect_provenance

    prov = collect_provenance(command).model_dump()
    prov["data"] = {**data_info, **P.file_digest(args.data)}
    if args.corpus:
        prov["corpus_file"] = P.file_digest(args.corpus)
    return prov


def _eval_config(args: argparse.Namespace, config: LongRAGConfig) -> dict[str, Any]:
    return {
        "longrag": config.model_dump(),
        "eval": {
            "dataset": args.dataset, "data": args.data, "corpus": args.corpus, "pool": args.pool,
            "units": args.units, "links": args.links, "k": args.ks, "pipeline": args.pipeline,
            "reader_k": args.reader_k, "limit": args.limit, "endpoint": args.endpoint, "encode": args.encode,
            "answer_recall_all_types": args.answer_recall_all_types,
        },
    }


# ---------------------------------------------------------------------------------------- CLI
def _pool(value: str) -> str | int:
    if value in ("all", "selected"):
        return value
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise argparse.ArgumentTypeError(f"--pool takes all, selected or a positive integer, not {value!r}")


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


_ks = int_list(min_value=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=sorted(DATASET_FORMATS))
    p.add_argument("--data", help="QA file (JSON/JSONL) of the dataset")
    p.add_argument("--corpus", help="corpus file instead of the pooled paragraphs (corpus JSON/JSONL, DPR passages)")
    p.add_argument("--pool", type=_pool, default="all",
                   help="corpus = paragraphs of all questions of the file (default), of the evaluated "
                        "(--limit) ones only ('selected'), or of the first N questions (an integer)")
    p.add_argument("--unit", dest="units", type=_csv, default=["grouped"],
                   help="grouped|document|passage, comma-separated to compare several")
    p.add_argument("--links", type=_csv, default=["titles"],
                   help="hyperlinks|titles|tfidf|both (grouped units only), comma-separated to compare")
    p.add_argument("--k", dest="ks", type=lambda s: sorted(set(_ks(s))), default=[1, 2, 4, 8],
                   help="retrieval depths to score, comma-separated positive integers")
    p.add_argument("--pipeline", choices=["retrieve", "longrag"], default="retrieve")
    p.add_argument("--reader-k", type=number(int, min_value=1), default=4, help="units given to the reader")
    p.add_argument("--reader-concurrency", type=number(int, min_value=1), default=1,
                   help="reader calls in flight (remote LLMs)")
    p.add_argument("--limit", type=number(int, min_value=1), help="evaluate the first N questions")
    p.add_argument("--out", required=True, help="output directory for the report")
    p.add_argument("--index-dir", default="artifacts/eval-index", help="root of the index builds (local or s3://)")
    p.add_argument("--rebuild-index", action="store_true", help="rebuild even when a matching build exists")
    p.add_argument("--endpoint", help="running Serve app URL: retrieve/answer over HTTP instead of local actors")
    p.add_argument("--http-timeout", type=number(float, min_value=0, min_exclusive=True), default=300.0)
    p.add_argument("--encode", choices=["auto", "driver", "ray-data"], default="auto", help="query encoding")
    p.add_argument("--answer-recall-all-types", action="store_true",
                   help="answer recall over all question types (default for HotpotQA: bridge only, as in LongRAG, "
                        "Jiang et al., 2024, Section 4.2)")
    p.add_argument("--config", help="YAML config file (LongRAGConfig)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config override")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a new local Ray)")
    p.add_argument("--num-cpus", type=number(float, min_value=0, min_exclusive=True), default=4,
                   help="logical CPUs for a new local Ray")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--combine", nargs="+", metavar="RUN_DIR", help="combine earlier run directories into --out")
    args = p.parse_args(argv)
    if args.combine:
        return args
    if not args.dataset or not args.data:
        p.error("--dataset and --data are required (unless --combine)")
    bad = [u for u in args.units if u not in ("grouped", "document", "passage")]
    if bad or not args.units:
        p.error(f"--unit takes grouped, document, passage; got {args.units}")
    bad = [x for x in args.links if x not in ("hyperlinks", *LINK_METHODS)]
    if bad or not args.links:
        p.error(f"--links takes hyperlinks, titles, tfidf, both; got {args.links}")
    if not args.ks or args.ks[0] < 1:
        p.error("--k needs positive integers")
    if args.reader_k < 1:
        p.error("--reader-k must be >= 1")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be >= 1")
    return args


def settings_of(units: list[str], links: list[str]) -> list[tuple[str, str, str]]:
    """(unit, links, label) per setting: links vary only grouped units; labels name what varies."""
    out = []
    for unit in dict.fromkeys(units):
        for ln in links if unit == "grouped" else links[:1]:
            label = f"{unit}-{ln}" if unit == "grouped" and len(links) > 1 else unit
            out.append((unit, ln, label))
    return out


def run(args: argparse.Namespace, command: list[str]) -> dict[str, Any]:
    """Every setting of ``args`` on the connected Ray cluster (or endpoint); writes the reports."""
    config = load_config(args.config, list(args.set))
    t_all = time.perf_counter()
    chosen, all_ex, data_info = load_examples(args.dataset, args.data, args.limit)
    log.info("%d questions to evaluate (%d in %s)", len(chosen), len(all_ex), args.data)
    docs, corpus_files, corpus_info = corpus_documents(args.dataset, args.data, args.corpus, args.pool, chosen, all_ex)
    log.info("corpus: %d documents (%s)", len(docs), corpus_info)
    provenance = _provenance(args, command, data_info)
    eval_config = _eval_config(args, config)
    settings = settings_of(args.units, args.links)
    out = Path(args.out)
    all_results: list[dict[str, Any]] = []
    flats: list[dict[str, Any]] = []
    infos: list[dict[str, Any]] = []
    for unit, links, label in settings:
        log.info("setting %s: unit=%s links=%s pipeline=%s", label, unit, links, args.pipeline)
        scored, flat, info = run_setting(
            args, config, unit=unit, links=links, label=label, chosen=chosen, docs=docs,
            corpus_files=corpus_files, corpus_info=corpus_info, command=command,
        )
        run_dir = out if len(settings) == 1 else out / label
        extra = {"corpus": corpus_info, "run": info}
        write_run(run_dir, scored, flat, eval_config, provenance, extra, f"{args.dataset}: {label} units")
        log.info("wrote %s (%s)", run_dir, json.dumps(flat["retrieval"]))
        all_results += scored
        flats.append(flat)
        infos.append(info)
    if len(settings) > 1:
        write_run(out, all_results, flats, eval_config, provenance, {"corpus": corpus_info, "runs_info": infos},
                  f"{args.dataset}: retrieval by unit granularity")
    for _, _, label in settings:  # every answer is in the written reports now
        checkpoint_file(out, label).unlink(missing_ok=True)
    wall = round(time.perf_counter() - t_all, 2)
    summary = {"out": str(out), "wall_s": wall, "runs": flats, "index_reused": [i.get("index", {}).get("reused") for i in infos]}
    (out / "run_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(raw)
    command = ["python", "-m", "jobs.evaluate", *raw]
    if not args.combine:
        try:  # a bad --config/--set value is refused before anything starts
            load_config(args.config, list(args.set))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.combine:
        paths = combine(args.combine, args.out, command)
        print(json.dumps(paths, indent=2))
        return 0
    handle = None
    if not args.endpoint:
        from cluster.local import start_or_join

        handle = start_or_join(args.address, num_cpus=args.num_cpus)
    try:
        summary = run(args, command)
    except (ValueError, RuntimeError) as exc:
        log.error("evaluation failed: %s", exc)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if handle is not None and handle.started:
            handle.shutdown()
    print(json.dumps({k: summary[k] for k in ("out", "wall_s", "index_reused")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
