"""Link builders for corpora without hyperlinks (QA context pools, plain passage files), over
:class:`~longrag.types.Document` lists.

Both return new documents with ``links`` filled with target *titles*, so they feed the same grouping
step as wikitext hyperlinks (``longrag.index.grouping``), and both are the index job's own linkers
run in one process: title mentions (:mod:`longrag.index.titles`) and TF-IDF neighbours
(:func:`longrag.index.links.tfidf_neighbours`, with ``units.tfidf_*``'s defaults), so ``jobs.evaluate
--links tfidf`` and ``jobs.index --set units.links=tfidf`` build the same links.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from longrag.config import UnitConfig
from longrag.index.grouping import titled_text
from longrag.index.links import tfidf_neighbours
from longrag.index.titles import title_mention_links
from longrag.types import Document

_UNITS = UnitConfig()


def tfidf_neighbour_links(
    docs: list[Document],
    *,
    top_m: int = _UNITS.tfidf_top_m,
    threshold: float = _UNITS.tfidf_threshold,
    n_features: int = _UNITS.tfidf_features,
    include_title: bool = True,
    block_size: int = 1024,
    keep_existing: bool = False,
) -> list[Document]:
    """New documents linking to their ``top_m`` most TF-IDF-cosine-similar others (sim >= threshold),
    ties by lower document index. Documents sharing a title with the source are not linked (they are
    the same page)."""
    if not docs:
        return []
    texts = [titled_text(d.title, d.text) if include_title else d.text for d in docs]
    neighbours = tfidf_neighbours(texts, top_m=top_m, threshold=threshold, n_features=n_features,
                                  block_size=block_size)
    out = []
    for i, d in enumerate(docs):
        found = list(dict.fromkeys(docs[j].title for j in neighbours[i] if docs[j].title != d.title))
        links = list(dict.fromkeys([*d.links, *found])) if keep_existing else found
        out.append(replace(d, links=links))
    return out


def link_stats(docs: list[Document]) -> dict[str, Any]:
    """Counts over the in-corpus link graph: directed and undirected edges, isolated documents
    (no in- or out-link), documents with out-links, dangling links (to titles not in the corpus)."""
    titles = {d.title for d in docs}
    directed: set[tuple[str, str]] = set()
    dangling = 0
    for d in docs:
        for t in d.links:
            if t in titles and t != d.title:
                directed.add((d.title, t))
            elif t not in titles:
                dangling += 1
    undirected = {tuple(sorted(e)) for e in directed}
    touched = {a for a, _ in directed} | {b for _, b in directed}
    isolated = sum(1 for d in docs if d.title not in touched)
    with_out = sum(1 for d in docs if any(t in titles and t != d.title for t in d.links))
    return {
        "documents": len(docs),
        "directed_edges": len(directed),
        "undirected_edges": len(undirected),
        "isolated_docs": isolated,
        "docs_with_outlinks": with_out,
        "dangling_links": dangling,
        "mean_out_degree": (len(directed) / len(docs)) if docs else 0.0,
    }


def build_links(
    docs: list[Document],
    method: str = "title_mentions",
    **kwargs: Any,
) -> list[Document]:
    """Dispatch: ``title_mentions``, ``tfidf``, or ``both`` (union, title-mention links first).

    ``kwargs`` go to the chosen builder; for ``both`` pass ``title_kwargs`` / ``tfidf_kwargs``.
    """
    if method == "title_mentions":
        return title_mention_links(docs, **kwargs)
    if method == "tfidf":
        return tfidf_neighbour_links(docs, **kwargs)
    if method == "both":
        a = title_mention_links(docs, **kwargs.get("title_kwargs", {}))
        b = tfidf_neighbour_links(docs, **kwargs.get("tfidf_kwargs", {}))
        return [replace(x, links=list(dict.fromkeys([*x.links, *y.links]))) for x, y in zip(a, b)]
    raise ValueError(f"unknown link method {method!r}; use title_mentions, tfidf or both")
