"""Seeded Wikipedia-like corpus metadata for scale benchmarks: article lengths and a power-law link graph.

English Wikipedia has ~6.8M articles with ~20 outgoing links on average (half of them to other
articles in the main namespace after redirects), an in-degree distribution with a power-law tail
(a few articles such as countries are linked from hundreds of thousands of pages) and a long-tailed
length distribution (median article a few hundred words, some over 10K). The generator reproduces
those shapes, not Wikipedia's numbers: out-degree ~ lognormal with the requested mean, link targets
drawn by a Zipf popularity over a random permutation of the articles, lengths ~ lognormal.
Only the arrays Algorithm 1 needs are produced; no text (see LongRAG, Jiang et al., 2024, Section 3.1).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["CorpusGraph", "wikilike_graph", "wikilike_title", "write_wikilike_corpus"]


@dataclass(frozen=True)
class CorpusGraph:
    """Metadata of a generated corpus: ``n_tokens[d]`` and directed links ``src[i] -> dst[i]``."""

    n_tokens: np.ndarray
    src: np.ndarray
    dst: np.ndarray

    @property
    def n_docs(self) -> int:
        return int(self.n_tokens.shape[0])

    @property
    def n_links(self) -> int:
        return int(self.src.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.n_tokens.nbytes + self.src.nbytes + self.dst.nbytes)


def wikilike_graph(
    n_docs: int,
    mean_links: float = 10.0,
    seed: int = 0,
    zipf_exponent: float = 0.8,
    median_tokens: int = 450,
    length_sigma: float = 1.0,
    max_tokens: int = 40_000,
) -> CorpusGraph:
    """``n_docs`` articles with lognormal lengths (median ``median_tokens``) and about
    ``n_docs * mean_links`` directed links whose targets follow a Zipf law (``zipf_exponent``) over a
    random popularity order, so in-degrees have a power-law tail. Self-links are left in (the grouping
    drops them, as it drops them in real dumps). Deterministic for a seed."""
    if n_docs <= 0:
        raise ValueError(f"n_docs must be > 0, got {n_docs}")
    if mean_links < 0:
        raise ValueError(f"mean_links must be >= 0, got {mean_links}")
    rng = np.random.default_rng(seed)
    n_tokens = np.clip(
        rng.lognormal(np.log(median_tokens), length_sigma, size=n_docs), 16, max_tokens
    ).astype(np.int64)
    # out-degree ~ lognormal(sigma=1) scaled to the mean: most pages link a few times, hubs hundreds
    sigma = 1.0
    raw = rng.lognormal(0.0, sigma, size=n_docs)
    out_degree = np.floor(raw * (mean_links / np.exp(sigma**2 / 2)) + rng.random(n_docs)).astype(np.int64)
    n_links = int(out_degree.sum())
    src = np.repeat(np.arange(n_docs, dtype=np.int64), out_degree)
    # Zipf popularity: rank r is drawn with probability ~ 1 / r**a (inverse CDF on the continuous law)
    u = rng.random(n_links)
    if zipf_exponent == 1.0:
        ranks = np.floor(np.exp(u * np.log(n_docs + 1.0))).astype(np.int64) - 1
    else:
        a = 1.0 - zipf_exponent
        ranks = np.floor((1.0 + u * ((n_docs + 1.0) ** a - 1.0)) ** (1.0 / a)).astype(np.int64) - 1
    ranks = np.clip(ranks, 0, n_docs - 1)
    popularity = rng.permutation(n_docs).astype(np.int64)  # rank -> article
    dst = popularity[ranks]
    return CorpusGraph(n_tokens=n_tokens, src=src, dst=dst)


def wikilike_title(i: int, adjectives: Sequence[str], nouns: Sequence[str]) -> str:
    """A unique, stable title for article ``i`` (``Adjective noun i``), computed without a table."""
    h = (i * 2654435761) & 0xFFFFFFFF  # Knuth's multiplicative hash: neighbours get unrelated words
    return f"{adjectives[h % len(adjectives)].capitalize()} {nouns[(h >> 12) % len(nouns)]} {i}"


def write_wikilike_corpus(
    out_dir: str | Path,
    n_docs: int,
    n_files: int = 8,
    mean_links: float = 10.0,
    seed: int = 0,
    chars_per_token: float = 4.0,
) -> list[Path]:
    """Write a generated corpus as ``n_files`` JSONL files (``doc_id``, ``title``, ``text``, ``links``:
    the titles of linked articles), streamed: memory holds the metadata arrays, never the corpus.
    Texts are real Wikipedia sentences from the bundled samples drawn at random up to each article's
    length, so tokenizers, sentence splitters and chunkers see realistic text."""
    from lab.synthetic.common import wikipedia_sentences
    from longrag.data import WORDLISTS_DIR, data_path

    if n_files <= 0:
        raise ValueError(f"n_files must be > 0, got {n_files}")
    graph = wikilike_graph(n_docs, mean_links=mean_links, seed=seed)
    words = Path(data_path(WORDLISTS_DIR))
    adjectives = (words / "adjectivelist.txt").read_text().split()
    nouns = (words / "nounlist.txt").read_text().split()
    pool = wikipedia_sentences()
    rng = random.Random(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    order = np.argsort(graph.src, kind="stable")
    bounds = np.searchsorted(graph.src[order], np.arange(n_docs + 1)).tolist()
    dst_sorted = graph.dst[order].tolist()
    per_file = -(-n_docs // n_files)
    paths: list[Path] = []
    for f in range(n_files):
        lo, hi = f * per_file, min(n_docs, (f + 1) * per_file)
        if lo >= hi:
            break
        path = out / f"part-{f:05d}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for i in range(lo, hi):
                target = int(graph.n_tokens[i] * chars_per_token)
                parts: list[str] = []
                size = -1  # n sentences carry n - 1 joining spaces
                while size < target:
                    s = pool[rng.randrange(len(pool))]
                    parts.append(s)
                    size += len(s) + 1
                links = [wikilike_title(j, adjectives, nouns) for j in dst_sorted[bounds[i] : bounds[i + 1]]]
                rec = {"doc_id": f"w{i}", "title": wikilike_title(i, adjectives, nouns), "text": " ".join(parts), "links": links}
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths
