"""Long retrieval units (LongRAG, Jiang et al., 2024, "LongRAG: Enhancing Retrieval-Augmented Generation
with Long-context LLMs", Section 3.1): group related documents along hyperlinks.

``group_documents`` is Algorithm 1 with a token budget: documents are visited from low to high
degree (ties in corpus order); each one starts a new group and absorbs the existing groups that
hold any of its related documents, smallest first (ties: the older group first), as long as the
new group's token total stays within the budget. Bookkeeping is a union-find over documents (a
document -> group map), so a step costs about its degree, never a scan over all groups.

Departures from the reference code, on purpose: documents without links become units of their
own (instead of being dropped), and a document longer than the budget stays a unit on its own.
The units themselves (ids, texts, token counts, shards, and the paper's other granularities of
Table 3) are built in :mod:`longrag.index.units`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain

import numpy as np

from longrag.types import Document

__all__ = [
    "UNIT_SEPARATOR",
    "adjacency_csr",
    "build_adjacency",
    "csr_from_edges",
    "document_text",
    "earlier_neighbours",
    "group_csr",
    "group_documents",
    "groups_from_labels",
    "index_dtype",
    "link_edges",
    "normalize_title",
    "title_keys",
]

UNIT_SEPARATOR = "\n\n"
"""Joins the documents of a grouped unit; each document is written as ``Title\\ntext``."""



def normalize_title(title: str) -> str:
    """Wikipedia-style title key: underscores as spaces, whitespace collapsed, first letter upper."""
    t = " ".join(str(title).replace("_", " ").split())
    return t[:1].upper() + t[1:]


def titled_text(title: str, text: str) -> str:
    """``Title\\ntext`` (just the text when the title is empty)."""
    return f"{title}\n{text}" if title else text


def document_text(doc: Document) -> str:
    return titled_text(doc.title, doc.text)


def title_keys(titles: Iterable[str]) -> dict[str, int]:
    """Normalized title -> position of the first document with it: where two documents share a
    title, the first one gets the links."""
    out: dict[str, int] = {}
    for i, t in enumerate(titles):
        out.setdefault(normalize_title(t), i)
    return out


def link_edges(docs: Sequence[Document]) -> tuple[np.ndarray, np.ndarray]:
    """The documents' links as edge arrays ``(src, dst)`` of corpus positions, each link resolved by
    (normalized) title against the corpus (:func:`title_keys`); links to unknown titles are dropped,
    self-loops and duplicates are left to :func:`csr_from_edges`."""
    keys = title_keys(d.title for d in docs)
    src: list[int] = []
    dst: list[int] = []
    for i, d in enumerate(docs):
        found = link_positions(d.links, keys)
        src.extend([i] * len(found))
        dst.extend(found)
    return np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)


def link_positions(links: Iterable[str], keys: dict[str, int]) -> list[int]:
    """The positions (:func:`title_keys`) of the titles ``links`` name; unknown titles dropped."""
    out = []
    for t in links:
        j = keys.get(normalize_title(t))
        if j is not None:
            out.append(j)
    return out


def build_adjacency(docs: Sequence[Document], symmetric: bool = True) -> list[list[int]]:
    """Related documents of each document, as sorted corpus indices: :func:`link_edges` without
    self-loops and duplicates; ``symmetric=True`` relates both ends of a link."""
    src, dst = link_edges(docs)
    indptr, indices = csr_from_edges(len(docs), src, dst, symmetric=symmetric, what="links")
    bounds, dst_list = indptr.tolist(), indices.tolist()
    return [dst_list[bounds[i] : bounds[i + 1]] for i in range(len(docs))]


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


def index_dtype(n: int) -> np.dtype:
    """The narrowest integer type for document positions ``0..n-1`` (int32 up to 2**31 documents)."""
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def _unique_sorted_inplace(keys: np.ndarray, block: int = 1 << 20) -> np.ndarray:
    """The distinct values of sorted ``keys``, compacted to its front block by block (bounded
    temporaries, no second array); returns that front as a view."""
    w, prev = 0, None
    for lo in range(0, keys.shape[0], block):
        chunk = keys[lo : lo + block]
        keep = np.empty(chunk.shape[0], dtype=bool)
        keep[0] = prev is None or chunk[0] != prev
        np.not_equal(chunk[1:], chunk[:-1], out=keep[1:])
        prev = chunk[-1]
        kept = chunk[keep]  # a copy, so writing over keys[w:] (w <= lo) is safe
        keys[w : w + kept.shape[0]] = kept
        w += kept.shape[0]
    return keys[:w]


def csr_from_edges(
    n: int, src: np.ndarray, dst: np.ndarray, symmetric: bool = True, what: str = "edges"
) -> tuple[np.ndarray, np.ndarray]:
    """The related-documents graph as CSR arrays ``(indptr, indices)`` from edge arrays: self-loops
    dropped, duplicates collapsed, each row sorted; ``symmetric`` relates both ends of an edge.
    ``indptr`` is int64, ``indices`` :func:`index_dtype` (int32 below 2**31 documents).

    Memory, beside the inputs: one int64 key per directed edge (two per link when symmetric), sorted
    and deduplicated in place, then ``indices``: about 24 bytes per symmetric link at peak, 8 retained."""
    src = np.asarray(src)
    dst = np.asarray(dst)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError(f"src and dst must be 1-D arrays of one length, got {src.shape} and {dst.shape}")
    if src.size and not (np.issubdtype(src.dtype, np.integer) and np.issubdtype(dst.dtype, np.integer)):
        raise ValueError(f"{what} must hold integer document positions, got {src.dtype} and {dst.dtype}")
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        k = int(np.flatnonzero((src < 0) | (src >= n) | (dst < 0) | (dst >= n))[0])
        raise ValueError(f"{what}[{int(src[k])}] holds {int(dst[k])}, outside 0..{n - 1}")
    m, e = max(n, 1), int(src.shape[0])
    loop = np.iinfo(np.int64).max  # self-loops get this key: sorted last, then cut off
    keys = np.empty(2 * e if symmetric else e, dtype=np.int64)  # (src, dst) as src * n + dst
    for lo, (a, b) in enumerate(((src, dst), (dst, src))[: 2 if symmetric else 1]):
        part = keys[lo * e : (lo + 1) * e]
        part[:] = a
        part *= m
        part += b
        part[a == b] = loop
    keys.sort()  # by (src, dst); sort + in-place compaction: np.unique is 100x slower and copies
    keys = _unique_sorted_inplace(keys[: int(np.searchsorted(keys, loop))])
    indptr = np.searchsorted(keys, np.arange(n + 1, dtype=np.int64) * m).astype(np.int64)
    np.remainder(keys, m, out=keys)
    return indptr, keys.astype(index_dtype(n))


def earlier_neighbours(
    indptr: np.ndarray, indices: np.ndarray, rank: np.ndarray, block: int = 1 << 20
) -> tuple[np.ndarray, np.ndarray]:
    """Per document, its related documents of lower ``rank`` (visited earlier), as CSR
    ``(ptr, idx)`` in row order. Computed over blocks of about ``block`` entries, so the temporary
    arrays stay bounded whatever the graph's size; ``idx`` keeps ``indices``' dtype."""
    n = int(indptr.shape[0]) - 1
    counts = np.zeros(n, dtype=np.int64)
    kept: list[np.ndarray] = []
    start = 0
    while start < n:
        # rows [start, stop): as many as fit about ``block`` entries, at least one
        stop = max(int(np.searchsorted(indptr, indptr[start] + block, side="right")) - 1, start + 1)
        lo, hi = int(indptr[start]), int(indptr[stop])
        nbr = indices[lo:hi]
        rows = np.repeat(np.arange(start, stop, dtype=np.int64), np.diff(indptr[start : stop + 1]))
        earlier = rank[nbr] < rank[rows]
        counts[start:stop] = np.bincount(rows[earlier] - start, minlength=stop - start)
        kept.append(nbr[earlier])
        start = stop
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    idx = np.concatenate(kept) if kept else np.zeros(0, dtype=indices.dtype)
    return ptr, idx


def _iter_ints(a: np.ndarray, block: int = 1 << 16) -> Iterator[int]:
    """The entries of ``a`` as Python ints, converted a block at a time (not one list of them all)."""
    for lo in range(0, a.shape[0], block):
        yield from a[lo : lo + block].tolist()


def group_csr(n_tokens: np.ndarray, indptr: np.ndarray, indices: np.ndarray, budget: int = 4096) -> np.ndarray:
    """Algorithm 1 on arrays: the group label of every document (groups numbered by their first
    document). ``(indptr, indices)`` is the related-documents graph in CSR form with distinct,
    self-loop-free rows (:func:`csr_from_edges`); the driver of a Wikipedia-scale build holds only
    these arrays and the token counts, never a text.

    Documents are visited from low to high degree (ties in corpus order); each one starts a new group
    and absorbs the existing groups that hold any of its related documents, smallest first (ties: the
    older group first), while the group's token total stays within ``budget``. Bookkeeping is a
    union-find with path compression and union by size, so a step costs about its degree.

    Memory: each relation is looked at once, from its later end, so the loop keeps one array entry
    per relation (:func:`earlier_neighbours`, the ``indices`` dtype) and five typed arrays of 8 bytes
    per document; the rows are turned into Python ints one document at a time."""
    sizes = _check_sizes(n_tokens)
    n = int(sizes.shape[0])
    if budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    indptr = np.asarray(indptr, dtype=np.int64)
    if indptr.shape != (n + 1,):
        raise ValueError(f"indptr must have n + 1 = {n + 1} entries, got {indptr.shape}")
    indices = np.asarray(indices)
    if indices.size and not np.issubdtype(indices.dtype, np.integer):
        raise ValueError(f"indices must hold integers, got dtype {indices.dtype}")
    degree = np.diff(indptr)
    order = np.lexsort((np.arange(n), degree))  # degree, then corpus order
    rank = np.empty(n, dtype=index_dtype(n))
    rank[order] = np.arange(n, dtype=rank.dtype)
    e_ptr, e_idx = earlier_neighbours(indptr, indices, rank)
    del rank, degree
    # typed arrays, not lists: 8 bytes per document each instead of ~40 (a list's pointer + an int)
    ip = array("q", e_ptr.tobytes())
    del e_ptr
    tokens = array("q", sizes.tobytes())  # group total, valid at roots
    parent = array("q", np.arange(n, dtype=np.int64).tobytes())
    members = array("q", np.ones(n, dtype=np.int64).tobytes())  # member count, valid at roots
    created = array("q", bytes(8 * n))  # step at which the root's group was (re)created: the age tie-break

    for step, d in enumerate(_iter_ints(order), start=1):
        root = d
        total = tokens[d]
        lo, hi = ip[d], ip[d + 1]
        if lo != hi:
            roots = set()
            for r in e_idx[lo:hi].tolist():
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

    del ip, e_idx, tokens, members, created
    roots = np.asarray(parent, dtype=np.int64)
    del parent
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
