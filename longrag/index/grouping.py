"""Long retrieval units (LongRAG, Jiang et al., 2024, "LongRAG: Enhancing Retrieval-Augmented Generation
with Long-context LLMs", Section 3.1): group related documents along hyperlinks.

``group_documents`` is Algorithm 1 with a token budget: documents are visited from low to high
degree (ties in corpus order); each one starts a new group and absorbs the existing groups that
hold any of its related documents, smallest first (ties: the older group first), as long as the
new group's token total stays within the budget. Bookkeeping is a union-find over documents (a
document -> group map), so a step costs about its degree, never a scan over all groups.

Departures from the reference code, on purpose: documents without links become units of their
own (instead of being dropped), and a document longer than the budget stays a unit on its own.
``make_units`` also builds the paper's other granularities (Table 3): one unit per document, or
~100-word passages.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Literal

import numpy as np

from longrag.text.tokens import TokenCounter
from longrag.types import Document, Unit

if TYPE_CHECKING:
    from longrag.config import UnitConfig

__all__ = [
    "UNIT_SEPARATOR",
    "adjacency_csr",
    "build_adjacency",
    "csr_from_edges",
    "document_passages",
    "document_text",
    "group_csr",
    "group_documents",
    "groups_from_labels",
    "grouping_stats",
    "grouping_stats_arrays",
    "make_units",
    "make_units_from_config",
    "normalize_title",
    "passage_units",
    "units_from_groups",
]

UNIT_SEPARATOR = "\n\n"
"""Joins the documents of a grouped unit; each document is written as ``Title\\ntext``."""

_ID_DIGITS = 8
_PREFIX = {"grouped": "g", "document": "d", "passage": "p"}


def normalize_title(title: str) -> str:
    """Wikipedia-style title key: underscores as spaces, whitespace collapsed, first letter upper."""
    t = " ".join(str(title).replace("_", " ").split())
    return t[:1].upper() + t[1:]


def titled_text(title: str, text: str) -> str:
    """``Title\\ntext`` (just the text when the title is empty)."""
    return f"{title}\n{text}" if title else text


def document_text(doc: Document) -> str:
    return titled_text(doc.title, doc.text)


def build_adjacency(docs: Sequence[Document], symmetric: bool = True) -> list[list[int]]:
    """Related documents of each document, as sorted corpus indices.

    A link is resolved by (normalized) title against the corpus; links to unknown titles and to
    the document itself are dropped, duplicates collapse. Where two documents share a title the
    first one gets the links. ``symmetric=True`` relates both ends of a link."""
    index: dict[str, int] = {}
    for i, d in enumerate(docs):
        index.setdefault(normalize_title(d.title), i)
    n = len(docs)
    rows: list[list[int]] = [[] for _ in range(n)]
    for i, d in enumerate(docs):
        for link in d.links:
            j = index.get(normalize_title(link))
            if j is not None:
                rows[i].append(j)
                if symmetric:
                    rows[j].append(i)
    return _clean_adjacency(rows, n)


def group_documents(n_tokens: Sequence[int], adjacency: Sequence[Sequence[int]], budget: int = 4096) -> list[list[int]]:
    """Algorithm 1 with a token budget. Returns groups of corpus indices, each sorted, ordered by
    their first index; every document is in exactly one group.

    ``n_tokens[d]`` is document d's size; ``adjacency[d]`` its related documents (self-loops and
    duplicates are ignored; degree = number of distinct related documents). A thin list-of-lists
    front end of :func:`group_csr`."""
    sizes = _check_sizes(n_tokens)
    n = int(sizes.shape[0])
    if len(adjacency) != n:
        raise ValueError(f"adjacency has {len(adjacency)} rows but n_tokens has {n} documents")
    indptr, indices = adjacency_csr(adjacency, n)
    return groups_from_labels(group_csr(sizes, indptr, indices, budget))


def _check_sizes(n_tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    sizes = np.asarray(n_tokens)
    if sizes.ndim != 1:
        raise ValueError(f"n_tokens must be 1-D, got shape {sizes.shape}")
    if sizes.shape[0] and not np.issubdtype(sizes.dtype, np.integer):
        raise ValueError(f"n_tokens must hold integers, got dtype {sizes.dtype}")
    if sizes.shape[0] and int(sizes.min()) < 0:
        raise ValueError("n_tokens must be >= 0")
    return sizes.astype(np.int64, copy=False)


def csr_from_edges(
    n: int, src: np.ndarray, dst: np.ndarray, symmetric: bool = True, what: str = "edges"
) -> tuple[np.ndarray, np.ndarray]:
    """The related-documents graph as CSR arrays ``(indptr, indices)`` from edge arrays: self-loops
    dropped, duplicates collapsed, each row sorted; ``symmetric`` relates both ends of an edge.
    About 16 bytes per edge at peak: a 6M-document, 100M-link Wikipedia graph fits a driver's memory."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError(f"src and dst must be 1-D arrays of one length, got {src.shape} and {dst.shape}")
    bad = (dst < 0) | (dst >= n) | (src < 0) | (src >= n)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{what}[{int(src[k])}] holds {int(dst[k])}, outside 0..{n - 1}")
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    keys = np.sort(src * max(n, 1) + dst)  # by (src, dst); sort + mask: np.unique is 100x slower here
    if keys.size:
        keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    src = keys // max(n, 1)
    indices = keys - src * max(n, 1)
    indptr = np.searchsorted(src, np.arange(n + 1, dtype=np.int64)).astype(np.int64)
    return indptr, indices


def group_csr(n_tokens: np.ndarray, indptr: np.ndarray, indices: np.ndarray, budget: int = 4096) -> np.ndarray:
    """Algorithm 1 on arrays: the group label of every document (groups numbered by their first
    document). ``(indptr, indices)`` is the related-documents graph in CSR form with distinct,
    self-loop-free rows (:func:`csr_from_edges`); the driver of a Wikipedia-scale build holds only
    these arrays and the token counts, never a text.

    Documents are visited from low to high degree (ties in corpus order); each one starts a new group
    and absorbs the existing groups that hold any of its related documents, smallest first (ties: the
    older group first), while the group's token total stays within ``budget``. Bookkeeping is a
    union-find with path compression and union by size, so a step costs about its degree."""
    sizes = _check_sizes(n_tokens)
    n = int(sizes.shape[0])
    if budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    indptr = np.asarray(indptr, dtype=np.int64)
    if indptr.shape != (n + 1,):
        raise ValueError(f"indptr must have n + 1 = {n + 1} entries, got {indptr.shape}")
    degree = np.diff(indptr)
    order = np.lexsort((np.arange(n), degree))  # degree, then corpus order
    # Only related documents visited earlier can hold a group when d is visited: keep, per document,
    # its earlier neighbours (vectorized), so every relation is looked at once, from its later end.
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    row = np.repeat(np.arange(n, dtype=np.int64), degree)
    earlier = pos[indices] < pos[row]
    e_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(row[earlier], minlength=n), out=e_ptr[1:])
    ip = e_ptr.tolist()
    ix = indices[earlier].tolist()
    del row, earlier, pos
    tokens = sizes.tolist()  # group total, valid at roots
    parent = list(range(n))
    members = [1] * n  # member count, valid at roots
    created = [0] * n  # step at which the root's group was (re)created: the age tie-break

    for step, d in enumerate(order.tolist(), start=1):
        root = d
        total = tokens[d]
        lo, hi = ip[d], ip[d + 1]
        if lo != hi:
            roots = set()
            for r in ix[lo:hi]:
                x = r
                while parent[x] != x:
                    x = parent[x]
                while parent[r] != x:  # path compression
                    parent[r], r = x, parent[r]
                roots.add(x)
            # smallest first; equal sizes: the older group first (created values are unique)
            cands = sorted([(tokens[g], created[g], g) for g in roots]) if len(roots) > 1 else [
                (tokens[g], 0, g) for g in roots
            ]
            for size, _, g in cands:
                if total + size > budget:
                    break  # candidates are sorted by size and the new group only grows
                total += size
                if members[root] >= members[g]:  # union by size
                    a, b = root, g
                else:
                    a, b = g, root
                members[a] += members[b]
                parent[b] = a
                root = a
        tokens[root] = total
        created[root] = step

    roots = np.asarray(parent, dtype=np.int64)
    while True:  # pointer jumping: every document's root
        nxt = roots[roots]
        if np.array_equal(nxt, roots):
            break
        roots = nxt
    # number groups by their first document: np.unique's first occurrences are the smallest indices
    # (the smallest member of a group is the first document whose root is that root)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    is_root = roots == np.arange(n, dtype=np.int64)
    first_of_root = np.full(n, n, dtype=np.int64)
    np.minimum.at(first_of_root, roots, np.arange(n, dtype=np.int64))
    root_ids = np.flatnonzero(is_root)
    label_of_root = np.empty(n, dtype=np.int64)
    label_of_root[root_ids[np.argsort(first_of_root[root_ids], kind="stable")]] = np.arange(len(root_ids))
    return label_of_root[roots]


def groups_from_labels(labels: np.ndarray) -> list[list[int]]:
    """Group labels (numbered by first document) -> sorted member lists in label order."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0:
        return []
    order = np.argsort(labels, kind="stable")
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    return [g.tolist() for g in np.split(order, bounds)]


def adjacency_csr(adjacency: Sequence[Sequence[int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """List-of-lists related documents -> CSR ``(indptr, indices)`` (:func:`csr_from_edges`, not symmetrized)."""
    lengths = np.fromiter((len(row) for row in adjacency), dtype=np.int64, count=n)
    try:
        dst = np.fromiter(chain.from_iterable(adjacency), dtype=np.int64, count=int(lengths.sum()))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"adjacency must hold integer document indices: {exc}") from None
    src = np.repeat(np.arange(n, dtype=np.int64), lengths)
    return csr_from_edges(n, src, dst, symmetric=False, what="adjacency")


def _clean_adjacency(adjacency: Sequence[Sequence[int]], n: int) -> list[list[int]]:
    """Rows of distinct related documents, self-loops removed, indices checked (vectorized)."""
    indptr, indices = adjacency_csr(adjacency, n)
    bounds = indptr.tolist()
    dst_list = indices.tolist()
    return [dst_list[bounds[i] : bounds[i + 1]] for i in range(n)]


def units_from_groups(
    docs: Sequence[Document],
    groups: Sequence[Sequence[int]],
    counter: TokenCounter,
    prefix: str = "g",
    doc_tokens: Sequence[int] | None = None,
) -> list[Unit]:
    """One unit per group: documents as ``Title\\ntext`` joined by blank lines, in group order;
    ids ``{prefix}{i:08d}``. ``n_tokens`` is counted on the unit text, or, for an additive counter
    given the documents' counts ``doc_tokens``, summed from them (the same number, no recount)."""
    texts = [UNIT_SEPARATOR.join(document_text(docs[i]) for i in g) for g in groups]
    if doc_tokens is not None and getattr(counter, "additive", False):
        if len(doc_tokens) != len(docs):
            raise ValueError(f"doc_tokens has {len(doc_tokens)} entries for {len(docs)} documents")
        sep = counter.count(UNIT_SEPARATOR)
        counts = [sum(int(doc_tokens[i]) for i in g) + sep * (len(g) - 1) for g in groups]
    else:
        counts = counter.count_batch(texts)
    return [
        Unit(
            unit_id=f"{prefix}{k:0{_ID_DIGITS}d}",
            doc_ids=[docs[i].doc_id for i in g],
            titles=[docs[i].title for i in g],
            text=text,
            n_tokens=int(c),
        )
        for k, (g, text, c) in enumerate(zip(groups, texts, counts))
    ]


def document_passages(doc: Document, passage_words: int = 100) -> list[str]:
    """The passage texts of one document: consecutive ``passage_words``-word pieces, each written
    ``Title\\nwords`` (one title-only passage for a document without words)."""
    if passage_words <= 0:
        raise ValueError(f"passage_words must be > 0, got {passage_words}")
    words = doc.text.split()
    pieces = [words[i : i + passage_words] for i in range(0, len(words), passage_words)] or [[]]
    out = []
    for piece in pieces:
        body = " ".join(piece)
        out.append(f"{doc.title}\n{body}" if doc.title else body)
    return out


def passage_units(docs: Sequence[Document], counter: TokenCounter, passage_words: int = 100) -> list[Unit]:
    """The passage granularity: consecutive ``passage_words``-word pieces of each document (the last
    one shorter), each written ``Title\\nwords``. A document without words gives one title-only unit."""
    if passage_words <= 0:
        raise ValueError(f"passage_words must be > 0, got {passage_words}")
    meta: list[tuple[str, str]] = []
    texts: list[str] = []
    for d in docs:
        for text in document_passages(d, passage_words):
            texts.append(text)
            meta.append((d.doc_id, d.title))
    counts = counter.count_batch(texts)
    return [
        Unit(unit_id=f"p{k:0{_ID_DIGITS}d}", doc_ids=[doc_id], titles=[title], text=t, n_tokens=int(c))
        for k, ((doc_id, title), t, c) in enumerate(zip(meta, texts, counts))
    ]


def make_units(
    docs: Sequence[Document],
    kind: Literal["grouped", "document", "passage"] = "grouped",
    counter: TokenCounter | None = None,
    budget: int = 4096,
    passage_words: int = 100,
    symmetric: bool = True,
) -> list[Unit]:
    """Retrieval units of the chosen granularity (LongRAG, Section 4.2, Table 3).

    grouped: Algorithm 1 over the link graph with a ``budget`` of tokens (each document counted as
    ``Title\\ntext`` plus the separator that joins it to the next); document: one unit per document;
    passage: ``passage_words``-word pieces."""
    if counter is None:
        raise ValueError("make_units needs a token counter (see longrag.text.tokens)")
    if kind not in _PREFIX:
        raise ValueError(f"kind must be one of {sorted(_PREFIX)}, got {kind!r}")
    ids = [d.doc_id for d in docs]
    if len(set(ids)) != len(ids):
        raise ValueError("doc_id values must be unique")
    if kind == "passage":
        return passage_units(docs, counter, passage_words)
    if kind == "document":
        return units_from_groups(docs, [[i] for i in range(len(docs))], counter, prefix="d")
    if budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    sizes = counter.count_batch([document_text(d) for d in docs])
    sep = counter.count(UNIT_SEPARATOR)
    # k documents carry k-1 separators: sum(n_i + sep) <= budget + sep
    groups = group_documents(
        np.asarray(sizes, dtype=np.int64) + sep, build_adjacency(docs, symmetric=symmetric), budget + sep
    )
    return units_from_groups(docs, groups, counter, prefix="g", doc_tokens=sizes)


def make_units_from_config(docs: Sequence[Document], cfg: UnitConfig, counter: TokenCounter) -> list[Unit]:
    """``make_units`` with the ``units`` section of the config."""
    return make_units(
        docs,
        kind=cfg.kind,
        counter=counter,
        budget=cfg.max_group_tokens,
        passage_words=cfg.passage_words,
        symmetric=cfg.symmetric_links,
    )


def grouping_stats(units: Sequence[Unit], budget: int | None = None) -> dict:
    """Counts for a report: units, documents, documents-per-unit histogram, token statistics
    (and units over ``budget`` when given)."""
    n_docs = np.asarray([len(u.doc_ids) for u in units], dtype=np.int64)
    toks = np.asarray([u.n_tokens for u in units], dtype=np.int64)
    return grouping_stats_arrays(n_docs, toks, budget)


def grouping_stats_arrays(n_docs: np.ndarray, toks: np.ndarray, budget: int | None = None) -> dict:
    """:func:`grouping_stats` from per-unit arrays: documents and tokens of each unit."""
    n_docs = np.asarray(n_docs, dtype=np.int64)
    toks = np.asarray(toks, dtype=np.int64)
    n = int(n_docs.shape[0])
    sizes, counts = np.unique(n_docs, return_counts=True)
    hist = {int(k): int(c) for k, c in zip(sizes.tolist(), counts.tolist())}
    out: dict = {
        "n_units": n,
        "n_docs": int(n_docs.sum()),
        "docs_per_unit": dict(sorted(hist.items())),
        "docs_per_unit_mean": float(n_docs.mean()) if n else 0.0,
        "tokens": {
            "total": int(toks.sum()),
            "min": int(toks.min()) if n else 0,
            "mean": float(toks.mean()) if n else 0.0,
            "p50": float(np.percentile(toks, 50)) if n else 0.0,
            "p90": float(np.percentile(toks, 90)) if n else 0.0,
            "max": int(toks.max()) if n else 0,
        },
    }
    if budget is not None:
        out["n_over_budget"] = int((toks > budget).sum())
        out["n_over_budget_multi_doc"] = int(((toks > budget) & (n_docs > 1)).sum())
    return out
