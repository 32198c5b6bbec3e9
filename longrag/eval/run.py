"""One evaluation run (pure core, no Ray): load the questions, pool the corpus, retrieve through a
:class:`UnitSource` backend, read, score and write the reports.

The backend is what differs between a local run and one against a running Serve app: the local one
(``actors/evaluate.py``) builds or reuses an index and searches it with ``ShardedIndex`` actors;
:class:`EndpointRetrieval` posts to ``/v1/retrieve``. The reader is the in-process ``LongReader``
or ``/v1/answer``; its answers are checkpointed as they come, so a rerun reads only what is
missing. Reports: ``metrics.json``, ``predictions.jsonl``, ``report.md`` and PNG plots per setting,
and a combined report when several settings are compared (LongRAG, Jiang et al., 2024, Section 4.2,
Tables 1-2).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from longrag.config import LongRAGConfig
from longrag.eval import pipeline as P
from longrag.eval.checkpoint import ReaderCheckpoint
from longrag.eval.corpus import PooledCorpus, load_corpus_file, load_dpr_passages, pool_examples
from longrag.eval.datasets import QAExample, load_qa
from longrag.eval.links import build_links
from longrag.eval.plan import (
    DATASET_FORMATS,
    LINK_METHODS,
    EvalConfig,
    EvalRun,
    EvalSetting,
    checkpoint_file,
    file_digest,
    reader_setup,
)
from longrag.eval.report import score_results, summarize
from longrag.eval.runs import write_run
from longrag.progress import progress as progress_bar
from longrag.types import Document, Unit

log = logging.getLogger(__name__)


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


# ---------------------------------------------------------------------------------------- retrieval
class UnitSource(Protocol):
    """Where a run's units come from. ``retrieve`` returns the ranked ``retrieved`` lists (one per
    question, :func:`longrag.eval.pipeline.retrieved_from_hits` rows) and run info: ``retrieval``
    (timings, ``search_fetch_s`` at least) and, for a local index, ``index``."""

    def retrieve(self, run: EvalRun, setting: EvalSetting, docs: list[Document], corpus_files: list[str],
                 questions: list[str], k: int) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]: ...


def _post(client: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(url, json=body)
    if resp.status_code != 200:
        raise RuntimeError(f"POST {url} -> HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.json()


class EndpointRetrieval:
    """Top-k units per question from a running Serve app (``POST {endpoint}/v1/retrieve``); unit
    texts are rebuilt from the local corpus (exact for document and grouped units)."""

    def __init__(self, endpoint: str, timeout_s: float, progress: bool) -> None:
        self.endpoint, self.timeout_s, self.progress = endpoint, timeout_s, progress

    def retrieve(self, run: EvalRun, setting: EvalSetting, docs: list[Document], corpus_files: list[str],
                 questions: list[str], k: int) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
        import httpx

        from longrag.index.grouping import document_text

        doc_texts = {d.doc_id: document_text(d) for d in docs} if setting.unit != "passage" else None
        out = []
        t0 = time.perf_counter()
        degraded = 0
        with httpx.Client(timeout=self.timeout_s) as client:
            bar = progress_bar(len(questions), "retrieve (http)", bar=self.progress, logger=log)
            for q in questions:
                body = _post(client, f"{self.endpoint.rstrip('/')}/v1/retrieve", {"question": q, "k": k})
                degraded += bool((body.get("coverage") or {}).get("degraded"))
                out.append(P.retrieved_from_endpoint(body["units"], doc_texts))
                bar.update(1)
            bar.close()
        stats = {"endpoint": self.endpoint, "search_fetch_s": round(time.perf_counter() - t0, 3),
                 "degraded_requests": degraded}
        return out, {"retrieval": stats}


# ---------------------------------------------------------------------------------------- reader
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
    packed = config.retrieval.packs  # the units' chunk scores pack the reader's budget

    async def run_all() -> None:
        sem = asyncio.Semaphore(max(1, concurrency))
        bar = progress_bar(len(todo), "read", bar=progress, logger=log)

        async def one(r: dict[str, Any]) -> None:
            units = [
                Unit(unit_id=u["unit_id"], doc_ids=u.get("doc_ids", []), titles=u["titles"], text=u["text"],
                     n_tokens=u["n_tokens"], chunk_scores=[tuple(c) for c in u["chunk_scores"]] if packed
                     and u.get("chunk_scores") else None)
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
    run: EvalRun, retrieval: UnitSource, setting: EvalSetting, *, chosen: list[QAExample], docs: list[Document],
    corpus_files: list[str],
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Retrieve (and read) for one setting; returns (scored results, flat metrics, info)."""
    ev = run.eval
    questions = [ex.question for ex in chosen]
    info: dict[str, Any] = {"unit": setting.unit, "links": setting.links, "label": setting.label}
    t0 = time.perf_counter()
    retrieved, got = retrieval.retrieve(run, setting, docs, corpus_files, questions, ev.k_max())
    info.update(got)
    # per-question retrieval cost: query encoding + search + unit fetch (not index build or shard load)
    retrieval_s = info["retrieval"].get("encode_s", 0.0) + info["retrieval"]["search_fetch_s"]
    reader_k = ev.reader_k if ev.reads else None
    results = []
    for ex, ret in zip(chosen, retrieved):
        r = P.base_result(ex, setting.label, reader_k)
        r["retrieved"] = ret
        r["retrieval_s"] = retrieval_s / max(1, len(chosen))
        results.append(r)
    if ev.reads:
        ckpt = checkpoint_file(ev.out, setting.label)
        if ev.endpoint:
            info["reader"] = run_reader_endpoint(results, ev.endpoint, ev.reader_k, ev.progress, ev.http_timeout,
                                                 checkpoint_path=ckpt)
        else:
            info["reader"] = run_reader_local(results, run.config, ev.reader_k, ev.reader_concurrency, ev.progress,
                                              checkpoint_path=ckpt)
    return _finish(ev, setting, results, info, len(docs), t0, truncate=_embedding_truncate(run.config))


def _embedding_truncate(config: LongRAGConfig) -> Any:
    """``truncate(text, n)`` with the embedding model's tokenizer (the units' ``n_tokens``)."""
    from longrag.index.embedding import tokenizer_dir
    from longrag.text.tokens import counter_for_model_dir

    try:
        return counter_for_model_dir(tokenizer_dir(config.embedding.model)).truncate
    except (OSError, ValueError) as exc:  # a hub model not in the local cache: no recall at equal tokens
        log.warning("no tokenizer for %s (%s): paragraph recall within token budgets left out",
                    config.embedding.model, exc)
        return None


def _finish(ev: EvalConfig, setting: EvalSetting, results: list[dict[str, Any]], info: dict[str, Any],
            n_docs: int, t0: float, truncate: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    ar_types = None if ev.answer_recall_all_types else P.DEFAULT_ANSWER_RECALL_TYPES.get(ev.dataset)
    reader_k = ev.reader_k if ev.reads else None
    # each dataset's own F1 rule (LongBench: plain token F1, not HotpotQA's yes/no rule)
    scored = score_results(results, ks=ev.ks, answer_recall_types=ar_types, f1_metric=P.qa_f1_metric(ev.dataset),
                           budgets=ev.token_budgets, truncate=truncate)
    flat = P.flat_metrics(scored, summarize(scored), dataset=ev.dataset, unit=setting.unit, reader_k=reader_k)
    flat["label"] = setting.label
    flat["links"] = setting.links if setting.unit == "grouped" else None
    build = (info.get("index") or {}).get("build_report") or {}
    counts = build.get("counts") or {}
    flat["corpus_documents"] = counts.get("documents", n_docs)
    flat["corpus_units"] = counts.get("units", (info.get("retrieval") or {}).get("corpus_units"))
    flat["corpus_avg_unit_tokens"] = ((build.get("grouping") or {}).get("tokens") or {}).get("mean")
    flat["answer_recall_types"] = list(ar_types) if ar_types else "all"
    flat["qa_f1_rule"] = P.qa_f1_rule(ev.dataset)
    info["wall_s"] = round(time.perf_counter() - t0, 2)
    return scored, flat, info


# ---------------------------------------------------------------------------------------- the run
def provenance(run: EvalRun, data_info: dict[str, Any]) -> dict[str, Any]:
    from longrag.index.manifest import collect_provenance

    prov = collect_provenance(run.command).model_dump()
    prov["data"] = {**data_info, **file_digest(run.eval.data)}
    if run.eval.corpus:
        prov["corpus_file"] = file_digest(run.eval.corpus)
    return prov


def run_evaluation(run: EvalRun, retrieval: UnitSource) -> dict[str, Any]:
    """Every setting of ``run`` through ``retrieval``; writes the reports and returns the summary."""
    ev = run.eval
    t_all = time.perf_counter()
    chosen, all_ex, data_info = load_examples(ev.dataset, ev.data, ev.limit)
    log.info("%d questions to evaluate (%d in %s)", len(chosen), len(all_ex), ev.data)
    docs, corpus_files, corpus_info = corpus_documents(ev.dataset, ev.data, ev.corpus, ev.pool, chosen, all_ex)
    log.info("corpus: %d documents (%s)", len(docs), corpus_info)
    prov = provenance(run, data_info)
    report_config = run.report_config()
    settings = ev.settings()
    out = Path(ev.out)
    all_results: list[dict[str, Any]] = []
    flats: list[dict[str, Any]] = []
    infos: list[dict[str, Any]] = []
    for setting in settings:
        log.info("setting %s: unit=%s links=%s pipeline=%s", setting.label, setting.unit, setting.links, ev.pipeline)
        scored, flat, info = run_setting(run, retrieval, setting, chosen=chosen, docs=docs, corpus_files=corpus_files)
        run_dir = out if len(settings) == 1 else out / setting.label
        write_run(run_dir, scored, flat, report_config, prov, {"corpus": corpus_info, "run": info},
                  f"{ev.dataset}: {setting.label} units")
        log.info("wrote %s (%s)", run_dir, json.dumps(flat["retrieval"]))
        all_results += scored
        flats.append(flat)
        infos.append(info)
    if len(settings) > 1:
        write_run(out, all_results, flats, report_config, prov, {"corpus": corpus_info, "runs_info": infos},
                  f"{ev.dataset}: retrieval by unit granularity")
    for setting in settings:  # every answer is in the written reports now
        checkpoint_file(out, setting.label).unlink(missing_ok=True)
    summary = {"out": str(out), "wall_s": round(time.perf_counter() - t_all, 2), "runs": flats,
               "index_reused": [i.get("index", {}).get("reused") for i in infos]}
    (out / "run_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
