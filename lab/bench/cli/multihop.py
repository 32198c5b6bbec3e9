"""Which signal finds the other hops? Retrieval signals over one pooled multi-hop sample, one at a
time, in one process (no Ray, no LLM): the product's grouped units and MaxP (exact, numpy), BM25
over the same chunks (``bm25s``) alone and fused by reciprocal rank, Personalized PageRank over
the unit link graph seeded by the dense scores (``retrieval.mode=graph``'s :func:`longrag.index.graph.expand`), a second search with
the gold first-hop answer added to the question (the ceiling of an iterative second hop: a perfect
bridge), a second search with a bridge the embedder picks (the top unit's sentence nearest the
question; or the query moved toward the top unit's best chunk, Rocchio's dense feedback), and the
documents of each unit in evidence order. Prints a table (R@k, AR@k, PR@k,
paragraph recall within token budgets) and writes it with a JSON line to ``--out``.

    python -m jobs.bench multihop                                   # MuSiQue sample, MiniLM
    python -m jobs.bench multihop --data data/hotpotqa/hotpotqa_train100.json.gz --dataset hotpotqa
    python -m jobs.bench multihop --model /path/to/sentence-transformers/folder

The chunk vectors are cached on disk (``embedding.vector_cache``, :mod:`longrag.index.vector_cache`): a rerun
with the same model, settings and sample encodes nothing again, and its ``build_s`` is then the cache's time.

The LLM-made bridge (``retrieval.mode=iterative``) runs through ``jobs.evaluate``; see
docs/evaluation.md, "Multi-hop evidence".
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

from lab.bench.tables import publish
from longrag.cli import choice_list, int_list, job_setup, number
from longrag.config import EmbeddingConfig, RetrievalConfig
from longrag.eval import metrics as M
from longrag.eval.corpus import pool_examples
from longrag.eval.datasets import load_qa
from longrag.eval.links import build_links
from longrag.eval.plan import DATASET_FORMATS, LINK_METHODS
from longrag.index.chunking import chunk_units
from longrag.index.embedding import Embedder, tokenizer_dir
from longrag.index.evidence import order_by_evidence, scored_evidence
from longrag.index.fusion import Fusion, rrf_scores
from longrag.index.graph import GraphExpansion, expand, unit_graph_from_documents
from longrag.index.lexical import LexicalIndex
from longrag.index.units import make_units
from longrag.reading.packing import pack_units
from longrag.reading.prompts import format_context
from longrag.reading.reader import fit_units
from longrag.text.sentences import split_sentences
from longrag.text.tokens import counter_for_model_dir
from longrag.types import UnitHit

SIGNALS = ("dense", "evidence", "bm25", "rrf", "ppr", "oracle", "sentence", "rocchio", "context")
BUDGETS = (260, 650, 1024)
CONTEXTS = ("stored", "evidence", "packed")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def maxp(chunk_scores: np.ndarray, chunk_unit: np.ndarray, n_units: int) -> np.ndarray:
    """(questions, chunks) -> (questions, units): a unit's score is its best chunk's."""
    out = np.full((chunk_scores.shape[0], n_units), -np.inf, dtype=np.float64)
    for q in range(chunk_scores.shape[0]):
        np.maximum.at(out[q], chunk_unit, chunk_scores[q])
    return out


def ranks(scores: np.ndarray) -> np.ndarray:
    return np.argsort(-scores, axis=1, kind="stable")


def score(name: str, lists: list[list[int]], units: list[Any], texts: list[list[str]] | None, examples: list[Any],
          ks: list[int], truncate: Any) -> dict[str, Any]:
    """Mean R@k, AR@k, PR@k and PR within the token budgets of ranked unit lists."""
    rows: dict[str, list[float]] = {}
    for q, (ex, order) in enumerate(zip(examples, lists)):
        top = [units[u] for u in order[: max(ks)]]
        unit_texts = texts[q] if texts is not None else [u.text for u in top]
        gold = [p.text for p in ex.paragraphs if p.is_supporting]
        for k, v in M.gold_recall_at_k([u.titles for u in top], ex.gold_titles, ks).items():
            rows.setdefault(f"R@{k}", []).append(v)
        for k, v in M.answer_recall_at_k(unit_texts, ex.answers, ks).items():
            rows.setdefault(f"AR@{k}", []).append(v)
        for k, v in M.paragraph_recall_at_k(unit_texts, gold, ks).items():
            rows.setdefault(f"PR@{k}", []).append(v)
        for b, v in M.paragraph_recall_within(unit_texts, [u.n_tokens for u in top], gold, BUDGETS, truncate).items():
            rows.setdefault(f"PR<{b}", []).append(v)
    return {"signal": name, **{key: round(100 * float(np.mean(v)), 1) for key, v in rows.items()}}


def reader_contexts(order: np.ndarray, units: list[Any], chunks: list[Any], chunk_unit: np.ndarray,
                    chunk_scores: np.ndarray, examples: list[Any], reader_k: int, budgets: list[int],
                    counter: Any) -> list[dict[str, Any]]:
    """Gold paragraphs inside the reader's context of the top ``reader_k`` units, for each budget:
    the units whole in rank order (stored; evidence: documents best first), as the reader fits them
    (:func:`longrag.reading.reader.fit_units`), or packed paragraph by paragraph
    (:func:`longrag.reading.packing.pack_units`); tokens by ``counter`` (formatted blocks, titles in)."""
    sums = {c: {b: 0.0 for b in budgets} for c in CONTEXTS}
    ceiling = 0.0
    for q, ex in enumerate(examples):
        gold = [p.text for p in ex.paragraphs if p.is_supporting]
        stored, scored = [], []
        for u in order[q][:reader_k]:
            idx = np.flatnonzero(chunk_unit == u)
            ordered, _, spans = scored_evidence(units[u], [chunks[i].text for i in idx], chunk_scores[q, idx])
            stored.append(units[u])
            scored.append(replace(ordered, chunk_scores=spans))
        ceiling += M.paragraph_recall_at_k([u.text for u in stored], gold, [reader_k])[reader_k]
        plain = [replace(u, chunk_scores=None) for u in scored]
        for b in budgets:
            contexts = {
                "stored": fit_units(stored, b, counter.count, truncate=counter.truncate).blocks,
                "evidence": fit_units(plain, b, counter.count, truncate=counter.truncate).blocks,
                "packed": pack_units(scored, b, counter.count, truncate=counter.truncate).blocks,
            }
            for c, blocks in contexts.items():
                sums[c][b] += sum(M.paragraphs_found(format_context(blocks), gold)) / len(gold)
    n = len(examples)
    return [{"signal": f"reader context, top {reader_k} units: {c}", f"PR@{reader_k}": round(100 * ceiling / n, 1),
             **{f"RC<{b}": round(100 * sums[c][b] / n, 1) for b in budgets}} for c in CONTEXTS]


def plot_contexts(rows: list[dict[str, Any]], budgets: list[int], reader_k: int, title: str, path: str) -> None:
    """Gold paragraphs in the reader's context (%) against its budget, one line per context kind."""
    from longrag.figures import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for r, marker in zip(rows, "osD"):
        ax.plot(budgets, [r[f"RC<{b}"] for b in budgets], marker=marker, label=r["signal"].split(": ")[-1])
    ax.axhline(rows[0][f"PR@{reader_k}"], color="grey", ls="--", lw=1, label=f"in the top {reader_k} units")
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_xlabel("reader budget (tokens, MiniLM)")
    ax.set_ylabel("gold paragraphs read (%)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, path, title=title)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobs.bench multihop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="musique", choices=sorted(DATASET_FORMATS))
    p.add_argument("--data", default="data/musique/musique_train100.json.gz")
    p.add_argument("--model", default=EmbeddingConfig().model, help="embedding model (bundled name or folder)")
    p.add_argument("--signals", type=choice_list(SIGNALS), default=list(SIGNALS))
    p.add_argument("--k", type=int_list(), default=[1, 2, 4, 8])
    p.add_argument("--limit", type=number(int, min_value=1), default=None, metavar="N",
                   help="the first N questions (their paragraphs pooled); default all")
    p.add_argument("--reader-k", type=number(int, min_value=1), default=2,
                   help="context: units given to the reader (jobs.evaluate --reader-k)")
    p.add_argument("--context-budgets", type=int_list(min_value=1), default=[512, 1024, 2048],
                   help="context: the reader's budgets (reader.max_context_tokens) to measure")
    p.add_argument("--plot", metavar="PNG", help="context: also plot the gold paragraphs in the reader's context "
                   "against its budget, per context kind, with the top units' ceiling (PR@reader-k)")
    p.add_argument("--out", default="reports/bench-multihop")
    p.add_argument("--vector-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the chunk vectors of an earlier run with the same model and settings "
                        "(embedding.vector_cache; default on, --no-vector-cache encodes everything)")
    args = p.parse_args(argv)
    job_setup()
    examples = load_qa(args.data, DATASET_FORMATS[args.dataset]).examples
    examples = examples[: args.limit] if args.limit else examples
    docs = build_links(pool_examples(examples).documents, LINK_METHODS["titles"])
    embedder = Embedder(EmbeddingConfig(model=args.model, vector_cache=args.vector_cache))
    counter = counter_for_model_dir(tokenizer_dir(embedder.spec))
    t0 = time.perf_counter()
    units = make_units(docs, kind="grouped", counter=counter, budget=4096)
    chunks = chunk_units(units, embedder.max_chunk_tokens, counter)
    chunk_unit = np.array([{u.unit_id: i for i, u in enumerate(units)}[c.unit_id] for c in chunks])
    log(f"{len(docs)} documents -> {len(units)} units, {len(chunks)} chunks; embedding ...")
    vectors = embedder.encode_passages([c.text for c in chunks])
    if embedder.cache is not None:
        log(f"vector cache {embedder.cache.path}: {embedder.cache.hits} chunks found, {embedder.cache.misses} encoded")
    build_s = time.perf_counter() - t0
    questions = [ex.question for ex in examples]
    t1 = time.perf_counter()
    chunk_scores = embedder.encode_queries(questions) @ vectors.T
    dense = maxp(chunk_scores, chunk_unit, len(units))
    order = ranks(dense)
    query_ms = (time.perf_counter() - t1) * 1e3 / len(questions)
    kmax = max(args.k)
    results = []
    done = {"dense": [list(o) for o in order]}
    if "dense" in args.signals:
        results.append(score("dense (MaxP)", done["dense"], units, None, examples, args.k, counter.truncate))
    if "evidence" in args.signals:
        texts = []
        for q, o in enumerate(order):
            row = []
            for u in o[:kmax]:
                idx = np.flatnonzero(chunk_unit == u)
                row.append(order_by_evidence(units[u], [chunks[i].text for i in idx], chunk_scores[q, idx])[0].text)
            texts.append(row)
        results.append(score("dense, documents in evidence order", done["dense"], units, texts, examples, args.k,
                             counter.truncate))
    if {"bm25", "rrf"} & set(args.signals):
        lexical = LexicalIndex.build([c.text for c in chunks])  # the shards' BM25, over one pooled corpus
        lex_chunks = np.stack([lexical.scores(q) for q in questions]).astype(np.float64)
        lex_units = maxp(lex_chunks, chunk_unit, len(units))
        lex = ranks(lex_units)
        if "bm25" in args.signals:
            results.append(score("BM25 (bm25s) alone", [list(o) for o in lex], units, None, examples, args.k,
                                 counter.truncate))
        if "rrf" in args.signals:  # retrieval.mode=hybrid as the Retriever fuses (its default settings)
            fusion = Fusion.of(RetrievalConfig())
            fused = []
            for q in range(len(questions)):
                matched = [u for u in lex[q][:fusion.depth] if lex_units[q, u] > 0]
                rrf = rrf_scores([list(order[q][:fusion.depth]), matched], [1.0, fusion.lexical_weight], fusion.c)
                fused.append(sorted(rrf, key=lambda u: (-rrf[u], u)))
            results.append(score(f"hybrid: dense + {fusion.lexical_weight:g} BM25, reciprocal rank (top {fusion.depth} "
                                 "each)", fused, units, None, examples, args.k, counter.truncate))
    if "ppr" in args.signals:  # retrieval.mode=graph as the Retriever runs it (its default settings)
        graph = unit_graph_from_documents(docs, units, [0] * len(units))
        linked = int((np.diff(graph.indptr) > 0).sum())
        log(f"unit graph: {graph.n_links} links, {linked} of {len(units)} units linked")
        settings = GraphExpansion.of(RetrievalConfig())
        at = {u.unit_id: i for i, u in enumerate(units)}
        fused = []
        for q in range(len(questions)):
            hits = [UnitHit(units[u].unit_id, float(dense[q, u]), "") for u in order[q, : settings.depth]]
            fused.append([at[h.unit_id] for h in expand(hits, graph, kmax, settings)])
        results.append(score(f"dense + PPR over the unit graph ({graph.n_links} links)", fused, units, None,
                             examples, args.k, counter.truncate))
    def second_hop(queries: np.ndarray) -> list[list[int]]:
        """retrieval.mode=iterative's merge (longrag.retrieval.hops.merge_hops) of the first hop and a
        second search with ``queries``: the first hop's top unit, the second's list, the first's rest."""
        second = ranks(maxp(queries @ vectors.T, chunk_unit, len(units)))
        merged = []
        for a, b in zip(order, second):
            seen: dict[int, None] = dict.fromkeys([int(a[0]), *map(int, b[:kmax]), *map(int, a[1:kmax])])
            merged.append(list(seen)[:kmax])
        return merged

    def best_chunk(q: int) -> int:
        """The chunk of question ``q``'s top unit that scored best (the unit's MaxP chunk)."""
        idx = np.flatnonzero(chunk_unit == order[q][0])
        return int(idx[np.argmax(chunk_scores[q, idx])])

    if "oracle" in args.signals:
        bridges = [(ex.meta.get("question_decomposition") or [{}])[0].get("answer", "") for ex in examples]
        if any(bridges):
            merged = second_hop(embedder.encode_queries([f"{q} {b}" for q, b in zip(questions, bridges)]))
            results.append(score("second hop with the gold first-hop answer (ceiling)", merged, units, None,
                                 examples, args.k, counter.truncate))
    if "sentence" in args.signals:  # the bridge named by the embedder: the top unit's sentence nearest the question
        t2 = time.perf_counter()
        qvec = embedder.encode_queries(questions)
        picked = []
        for q in range(len(questions)):
            sentences = split_sentences(chunks[best_chunk(q)].text) or [chunks[best_chunk(q)].text]
            sims = embedder.encode_passages(sentences) @ qvec[q]
            picked.append(sentences[int(np.argmax(sims))])
        merged = second_hop(embedder.encode_queries([f"{q} {s}" for q, s in zip(questions, picked)]))
        ms = (time.perf_counter() - t2) * 1e3 / len(questions)
        results.append(score(f"second hop with the top unit's sentence nearest the question ({ms:.0f} ms/question)",
                             merged, units, None, examples, args.k, counter.truncate))
    if "rocchio" in args.signals:  # dense pseudo-relevance feedback: the query moved toward the best chunk, no encode
        qvec = embedder.encode_queries(questions)
        moved = qvec + np.stack([vectors[best_chunk(q)] for q in range(len(questions))])
        merged = second_hop(moved / np.linalg.norm(moved, axis=1, keepdims=True))
        results.append(score("second hop with the query + the top unit's best chunk vector (Rocchio)", merged, units,
                             None, examples, args.k, counter.truncate))
    if "context" in args.signals:
        contexts = reader_contexts(order, units, chunks, chunk_unit, chunk_scores, examples, args.reader_k,
                                   args.context_budgets, counter)
        results.extend(contexts)
        if args.plot:
            plot_contexts(contexts, args.context_budgets, args.reader_k, f"{args.dataset}, {len(examples)} questions",
                          args.plot)
    keys = [f"{m}@{k}" for k in args.k for m in ("R", "AR", "PR")] + [f"PR<{b}" for b in BUDGETS]
    keys += [f"RC<{b}" for b in args.context_budgets] if "context" in args.signals else []
    lines = ["| signal | " + " | ".join(keys) + " |", "| --- " * (len(keys) + 1) + "|"]
    lines += ["| " + r["signal"] + " | " + " | ".join(str(r.get(k, "-")) for k in keys) + " |" for r in results]
    summary = {"dataset": args.dataset, "questions": len(examples), "documents": len(docs), "units": len(units),
               "chunks": len(chunks), "model": args.model, "build_s": round(build_s, 1),
               "chunks_from_vector_cache": embedder.cache.hits if embedder.cache is not None else 0,
               "query_ms": round(query_ms, 2), "results": results}
    publish(args.out, "\n".join(lines), summary)
    return 0
