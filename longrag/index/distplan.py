"""The plan of a distributed index build on arrays: the driver holds document metadata, never a text.

Workers parse the corpus and write the documents to the build's ``documents/`` parquet parts; the
driver gets back, per document, where it was written (part, row), its id, title and token count
(:class:`DocMeta`), and, from a second pass over the parts, its links as document positions. That is
what LongRAG's grouping needs (Jiang et al., 2024, Section 3.1, Algorithm 1): token counts and the
link graph: ids and titles as Arrow strings, a few integers per document, 8 bytes per link.

- :func:`order_documents` puts documents in the order the in-driver path reads them (wiki page ids
  numerically, JSONL/parquet in file and line order) and drops later duplicates of a ``doc_id``;
- :func:`title_keys` / :func:`final_redirects` / :func:`resolve_links` resolve link titles the way
  :func:`longrag.index.grouping.build_adjacency` and :func:`longrag.corpus.wikitext.resolve_redirects`
  do, on a worker, from broadcast tables;
- :func:`plan_units` runs the grouping on arrays and balances units over shards
  (:func:`assign_shards_array`), giving a :class:`UnitPlan`: the unit of every document and the shard
  of every unit, the table that goes back to the workers;
- :func:`assemble_units` builds a shard's units from its documents' rows on a worker, with the same
  ids, members, texts and token counts as :func:`longrag.index.grouping.make_units`.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from longrag.index.grouping import (
    UNIT_SEPARATOR,
    _ID_DIGITS,
    _PREFIX,
    csr_from_edges,
    document_passages,
    document_text,
    group_csr,
    normalize_title,
)
from longrag.text.tokens import TokenCounter
from longrag.types import Unit

DOCUMENTS_PREFIX = "documents/"
STAGING_PREFIX = "staging/"
_STAGED_UNITS = re.compile(r"(?:^|/)staging/units/shard-(\d+)/part-\d+\.parquet$")


UNITS_PER_PART = 64
"""Units per staged parquet part: the grain at which the chunk + embed stage spreads a shard's
units over the embedding actors."""


def staged_units_prefix(shard: int) -> str:
    """Store prefix of a shard's assembled units (parquet parts) before the shard is built."""
    return f"{STAGING_PREFIX}units/shard-{shard:05d}/"


def shard_of_staged_path(path: str) -> int:
    """The shard of a staged units part from its key or path (the inverse of :func:`staged_units_key`)."""
    m = _STAGED_UNITS.search(path)
    if m is None:
        raise ValueError(f"{path!r} is not a staged units part ({STAGING_PREFIX}units/shard-NNNNN/part-NNNNN.parquet)")
    return int(m.group(1))


def staged_units_key(shard: int, part: int) -> str:
    return f"{staged_units_prefix(shard)}part-{part:05d}.parquet"


def staged_parts(n_units: int) -> int:
    """Number of staged parts of a shard of ``n_units`` units."""
    return -(-n_units // UNITS_PER_PART)


def stage_shard_units(storage: Any, shard: int, units: Sequence[Unit]) -> int:
    """Write a shard's units to the staging area in parts of :data:`UNITS_PER_PART`; returns the
    number of parts."""
    from longrag.store import units_to_parquet

    n = staged_parts(len(units))
    for k in range(n):
        storage.write_bytes(staged_units_key(shard, k), units_to_parquet(list(units[k * UNITS_PER_PART : (k + 1) * UNITS_PER_PART])))
    return n


def staged_chunks_prefix(shard: int) -> str:
    """Store prefix of a shard's embedded chunks (parquet parts) before the shard is built."""
    return f"{STAGING_PREFIX}chunks/shard-{shard:05d}/"


@dataclass
class DocMeta:
    """Per-document metadata the driver holds, in arrival order: ``part``/``row`` (where the
    document lies in ``documents/``), ``task``/``seq`` (source order), ``doc_id``, ``title``,
    ``n_tokens`` (of ``Title\\ntext``) and, for passage units, the token count of each passage.
    Ids and titles stay Arrow string arrays (their bytes plus an offset each, no Python object per
    document)."""

    part: np.ndarray
    row: np.ndarray
    task: np.ndarray
    seq: np.ndarray
    doc_id: pa.ChunkedArray
    title: pa.ChunkedArray
    n_tokens: np.ndarray
    passage_tokens: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def concat(cls, tables: Sequence[pa.Table]) -> "DocMeta":
        """From the parse tasks' output batches (Arrow tables with the columns above)."""

        def cat(name: str, dtype: Any) -> np.ndarray:
            arrays = [t.column(name).to_numpy().astype(dtype, copy=False) for t in tables]
            return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)

        def strings(name: str) -> pa.ChunkedArray:
            return pa.chunked_array([c for t in tables for c in t.column(name).chunks], type=pa.string())

        return cls(
            part=cat("part", np.int32), row=cat("row", np.int32), task=cat("task", np.int32),
            seq=cat("seq", np.int64), doc_id=strings("doc_id"), title=strings("title"),
            n_tokens=cat("n_tokens", np.int64),
            passage_tokens=[np.asarray(p, dtype=np.int64) for t in tables if "passage_tokens" in t.column_names
                            for p in t.column("passage_tokens").to_pylist()],
        )

    def __len__(self) -> int:
        return int(self.part.shape[0])

    @property
    def nbytes(self) -> int:
        """Memory of the arrays, bytes."""
        fixed = sum(a.nbytes for a in (self.part, self.row, self.task, self.seq, self.n_tokens))
        return int(fixed + self.doc_id.nbytes + self.title.nbytes + sum(p.nbytes for p in self.passage_tokens))


def order_documents(meta: DocMeta, fmt: str) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """``(order, duplicates)``: the arrival indices of the kept documents in corpus order, and
    ``(arrival index, doc_id)`` of each later duplicate of an id (dropped, as the JSONL reader drops
    them). Wiki exports are ordered by page id (the in-driver path sorts by ``(len(id), id)``),
    other formats by file and line. Vectorized over the Arrow ids: no Python string per document."""
    import pyarrow.compute as pc

    n = len(meta)
    if not n:
        return np.zeros(0, dtype=np.int64), []
    if fmt == "wikixml":  # (length in characters, id); UTF-8 byte order is code point order
        by = pa.table({"len": pc.utf8_length(meta.doc_id), "id": meta.doc_id})
        order = pc.sort_indices(by, sort_keys=[("len", "ascending"), ("id", "ascending")]).to_numpy()
    else:
        order = np.lexsort((meta.seq, meta.task))
    ids = meta.doc_id.take(pa.array(order))
    # a stable sort by id keeps each id's occurrences in corpus order: all but the first are duplicates
    by_id = pc.sort_indices(ids).to_numpy()
    sorted_ids = ids.take(pa.array(by_id))
    repeat = np.zeros(n, dtype=bool)
    repeat[1:] = pc.equal(sorted_ids[1:], sorted_ids[:-1]).to_numpy(zero_copy_only=False)
    dup_k = np.sort(by_id[repeat])
    keep = np.ones(n, dtype=bool)
    keep[dup_k] = False
    dup_ids = ids.take(pa.array(dup_k)).to_pylist()
    dups = [(int(order[k]), d) for k, d in zip(dup_k.tolist(), dup_ids)]
    return order[keep].astype(np.int64), dups


def title_keys(titles: Iterable[str]) -> dict[str, int]:
    """Normalized title -> position of the first document with it (as ``build_adjacency``)."""
    out: dict[str, int] = {}
    for i, t in enumerate(titles):
        out.setdefault(normalize_title(t), i)
    return out


def final_redirects(redirects: dict[str, str]) -> dict[str, str]:
    """Each redirect source -> the title at the end of its chain
    (:func:`longrag.corpus.wikitext.resolve_title`: a cycle leaves the title as it is)."""
    from longrag.corpus.wikitext import normalize_title as wiki_title
    from longrag.corpus.wikitext import resolve_title

    red = {wiki_title(k): wiki_title(v) for k, v in redirects.items()}
    return {k: resolve_title(k, red) for k in red}


def resolve_links(
    title: str, links: Sequence[str], keys: dict[str, int], redirects: dict[str, str] | None
) -> list[int]:
    """Positions of the documents ``links`` point to. With ``redirects`` (a wiki export: the map of
    :func:`final_redirects`), links go through them and a link that lands on the document's own title
    is dropped, as :func:`longrag.corpus.wikitext.resolve_redirects` does; links to titles outside the
    corpus are dropped, duplicates and self-loops are left to the graph builder."""
    if redirects is not None:
        from longrag.corpus.wikitext import normalize_title as wiki_title

        own = wiki_title(title)
        resolved = []
        for t in links:
            t = wiki_title(t)
            t = redirects.get(t, t)
            if t != own:
                resolved.append(t)
        links = resolved
    out = []
    for t in links:
        j = keys.get(normalize_title(t))
        if j is not None:
            out.append(j)
    return out


# ---------------------------------------------------------------------------------------- grouping
def assign_shards_array(n_tokens: np.ndarray, n_shards: int) -> np.ndarray:
    """Balance shards by tokens: largest unit first (ties: lower index) onto the lightest shard
    (ties: lower shard id). Deterministic; units are numbered in id order."""
    if n_shards <= 0:
        raise ValueError(f"n_shards must be > 0, got {n_shards}")
    toks = np.asarray(n_tokens, dtype=np.int64)
    order = np.lexsort((np.arange(toks.shape[0]), -toks))
    shard_of = np.zeros(toks.shape[0], dtype=np.int32)
    heap = [(0, s) for s in range(n_shards)]
    for i in order.tolist():
        load, s = heapq.heappop(heap)
        shard_of[i] = s
        heapq.heappush(heap, (load + int(toks[i]), s))
    return shard_of


@dataclass
class UnitPlan:
    """Units of a corpus on arrays. ``first_unit[p]``: the (first) unit of the document at position
    ``p``; ``unit_tokens``/``unit_docs``: per unit; ``shard_of_unit``: its shard."""

    kind: str
    first_unit: np.ndarray
    unit_tokens: np.ndarray
    unit_docs: np.ndarray
    shard_of_unit: np.ndarray

    @property
    def n_units(self) -> int:
        return int(self.unit_tokens.shape[0])

    @property
    def n_shards(self) -> int:
        return int(self.shard_of_unit.max()) + 1 if self.n_units else 0

    def units_per_shard(self) -> dict[int, int]:
        counts = np.bincount(self.shard_of_unit, minlength=self.n_shards)
        return {s: int(c) for s, c in enumerate(counts.tolist())}

    def stats(self) -> dict[str, Any]:
        """As :func:`longrag.index.grouping.grouping_stats`."""
        from longrag.index.grouping import grouping_stats_arrays

        return grouping_stats_arrays(self.unit_docs, self.unit_tokens)


def plan_units(
    kind: str,
    n_tokens: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    *,
    separator_tokens: int,
    budget: int,
    symmetric: bool,
    n_shards: int,
    passage_tokens: Sequence[np.ndarray] | None = None,
) -> UnitPlan:
    """Units of ``kind`` over documents in corpus order: grouped runs Algorithm 1 on the link graph
    ``src -> dst`` (positions) exactly as :func:`longrag.index.grouping.make_units` does (each document
    counted with the separator that joins it, budget plus one separator); document is one unit per
    document; passage takes ``passage_tokens[p]`` (the counts of document p's passages). Unit token
    counts are exact for an additive tokenizer (sums); the assembly recounts otherwise."""
    if kind not in _PREFIX:
        raise ValueError(f"kind must be one of {sorted(_PREFIX)}, got {kind!r}")
    sizes = np.asarray(n_tokens, dtype=np.int64)
    n = int(sizes.shape[0])
    if kind == "passage":
        if passage_tokens is None or len(passage_tokens) != n:
            raise ValueError("passage units need the token counts of every document's passages")
        per_doc = np.fromiter((len(p) for p in passage_tokens), dtype=np.int64, count=n)
        first = np.concatenate(([0], np.cumsum(per_doc)[:-1])) if n else np.zeros(0, dtype=np.int64)
        toks = np.concatenate(passage_tokens) if n else np.zeros(0, dtype=np.int64)
        docs = np.ones(toks.shape[0], dtype=np.int64)
    else:
        if kind == "grouped":
            if budget <= 0:
                raise ValueError(f"budget must be > 0, got {budget}")
            indptr, indices = csr_from_edges(n, src, dst, symmetric=symmetric, what="links")
            first = group_csr(sizes + separator_tokens, indptr, indices, budget + separator_tokens)
        else:
            first = np.arange(n, dtype=np.int64)
        n_units = int(first.max()) + 1 if n else 0
        docs = np.bincount(first, minlength=n_units).astype(np.int64)
        toks = np.bincount(first, weights=sizes, minlength=n_units).astype(np.int64) + separator_tokens * (docs - 1)
    shard_of = assign_shards_array(toks, min(n_shards, max(1, toks.shape[0]))) if toks.shape[0] else np.zeros(0, np.int32)
    return UnitPlan(kind=kind, first_unit=np.asarray(first, dtype=np.int64), unit_tokens=toks, unit_docs=docs,
                    shard_of_unit=shard_of)


def unit_id(kind: str, k: int) -> str:
    return f"{_PREFIX[kind]}{k:0{_ID_DIGITS}d}"


# ---------------------------------------------------------------------------------------- assembly
def assemble_units(
    kind: str,
    rows: Sequence[dict[str, Any]],
    counter: TokenCounter,
    passage_words: int = 100,
) -> list[Unit]:
    """Units from document rows (``unit``: the document's first unit, ``pos``: its corpus position,
    ``doc_id``, ``title``, ``text``, ``n_tokens``), in unit order; for passages, a row is one passage
    already (``unit`` its own number, ``text`` the passage). Texts, ids and token counts as
    :func:`longrag.index.grouping.make_units` gives them."""
    rows = sorted(rows, key=lambda r: (int(r["unit"]), int(r["pos"])))
    units: list[Unit] = []
    if kind == "passage":
        texts = [str(r["text"]) for r in rows]
        counts = counter.count_batch(texts)
        return [Unit(unit_id=unit_id(kind, int(r["unit"])), doc_ids=[str(r["doc_id"])], titles=[str(r["title"])],
                     text=t, n_tokens=int(c)) for r, t, c in zip(rows, texts, counts)]
    additive = getattr(counter, "additive", False)
    sep = counter.count(UNIT_SEPARATOR)
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j]["unit"] == rows[i]["unit"]:
            j += 1
        members = rows[i:j]
        text = UNIT_SEPARATOR.join(_doc_text(r) for r in members)
        n_tok = sum(int(r["n_tokens"]) for r in members) + sep * (len(members) - 1) if additive else -1
        units.append(Unit(unit_id=unit_id(kind, int(rows[i]["unit"])), doc_ids=[str(r["doc_id"]) for r in members],
                          titles=[str(r["title"]) for r in members], text=text, n_tokens=n_tok))
        i = j
    if not additive:
        for u, c in zip(units, counter.count_batch([u.text for u in units])):
            u.n_tokens = int(c)
    return units


def _doc_text(row: dict[str, Any]) -> str:
    from longrag.types import Document

    return document_text(Document(doc_id=str(row["doc_id"]), title=str(row["title"]), text=str(row["text"])))


def passage_rows(row: dict[str, Any], first_unit: int, passage_words: int) -> list[dict[str, Any]]:
    """The passage units of one document row, each a row for :func:`assemble_units`."""
    from longrag.types import Document

    doc = Document(doc_id=str(row["doc_id"]), title=str(row["title"]), text=str(row["text"]))
    return [{**row, "unit": first_unit + i, "text": t} for i, t in enumerate(document_passages(doc, passage_words))]
