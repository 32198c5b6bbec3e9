"""What ``python -m jobs.bench scale`` measures in its own process (Ray-free): Algorithm 1 on the
arrays a Wikipedia-sized driver holds (time and peak memory), the projection to a larger corpus, and
the chunk texts of the embedding benchmark."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from lab.synthetic.wikigraph import wikilike_graph
from longrag.index.grouping import csr_from_edges, group_csr
from longrag.memory import MemorySampler


def grouping_run(n_docs: int, mean_links: float, budget: int, seed: int) -> dict[str, Any]:
    graph = wikilike_graph(n_docs, mean_links=mean_links, seed=seed)
    with MemorySampler(0.01) as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        indptr, indices = csr_from_edges(n_docs, graph.src, graph.dst, symmetric=True)
        t1 = time.perf_counter()
        labels = group_csr(graph.n_tokens, indptr, indices, budget)
        t2, c2 = time.perf_counter(), time.process_time()
    n_groups = int(labels.max()) + 1
    totals = np.bincount(labels, weights=graph.n_tokens, minlength=n_groups)
    members = np.bincount(labels, minlength=n_groups)
    over = int(((totals > budget) & (members > 1)).sum())
    if over:
        raise AssertionError(f"{over} multi-document groups exceed the budget of {budget} tokens")
    return {
        "docs": n_docs,
        "links": graph.n_links,
        "relations": int(indices.shape[0]) // 2,
        "csr_s": round(t1 - t0, 2),
        "group_s": round(t2 - t1, 2),
        "wall_s": round(t2 - t0, 2),
        "cpu_s": round(c2 - c0, 3),
        "driver_extra_mb": round((mem.sample() - mem.base_bytes) / 2**20, 1),
        "driver_peak_extra_mb": round(mem.extra_mb, 1),
        "peak_bytes_per_link": round(mem.extra_mb * 2**20 / max(graph.n_links, 1), 1),
        "input_mb": round(graph.nbytes / 2**20, 1),
        "groups": n_groups,
        "docs_per_unit": round(n_docs / n_groups, 2),
        "multi_doc_units": int((members > 1).sum()),
    }


def project(rows: list[dict[str, Any]], target: int) -> dict[str, Any]:
    """CPU seconds at ``target`` documents along the log-log slope of the two largest runs."""
    a, b = rows[-2], rows[-1]
    slope = math.log(max(b["cpu_s"], 1e-3) / max(a["cpu_s"], 1e-3)) / math.log(b["docs"] / a["docs"])
    return {"docs": target, "slope": round(slope, 3), "cpu_s": round(b["cpu_s"] * (target / b["docs"]) ** slope, 1)}


def embed_texts(n_chunks: int, seed: int) -> list[str]:
    """``n_chunks`` chunk texts of real Wikipedia sentences, each close to the model's input limit."""
    import random

    from lab.synthetic.common import wikipedia_sentences
    from longrag.index.chunking import chunk_text
    from longrag.index.embedding import tokenizer_dir
    from longrag.text.tokens import counter_for_model_dir

    counter = counter_for_model_dir(tokenizer_dir("all-MiniLM-L6-v2"))
    pool = wikipedia_sentences()
    rng = random.Random(seed)
    text = " ".join(pool[rng.randrange(len(pool))] for _ in range(n_chunks * 14))
    chunks = chunk_text(text, 254, counter)
    if len(chunks) < n_chunks:
        raise RuntimeError(f"made {len(chunks)} chunks, wanted {n_chunks}")
    return chunks[:n_chunks]
