"""Retrieval units from documents (LongRAG, Jiang et al., 2024, Section 3.1 and Table 3), one path for
every build: the plan on arrays, then the texts.

- :func:`plan_units`: the unit of every document (grouped: Algorithm 1 over the link graph,
  :func:`longrag.index.grouping.group_csr`; document: one unit each; passage: ``passage_words``-word
  pieces) and the shard of every unit (:func:`assign_shards_array`), from token counts and link
  positions alone: a :class:`UnitPlan`;
- :func:`assemble_units`: the units of some documents from their rows, with ids (``g00000012``,
  ``d...``, ``p...``), members in corpus order, texts and token counts;
- :func:`make_units`: both steps over documents held in memory (the evaluation's corpora, the
  in-driver build, index updates). The distributed build (:mod:`actors.distbuild`) runs the same two
  steps: the plan on the driver, the assembly per shard on workers.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from longrag.index.grouping import UNIT_SEPARATOR, csr_from_edges, document_text, group_csr, link_edges
from longrag.text.tokens import TokenCounter
from longrag.types import Document, Unit

if TYPE_CHECKING:
    from longrag.config import UnitConfig

__all__ = [
    "UnitPlan",
    "assemble_units",
    "assign_shards_array",
    "document_passages",
    "grouping_stats",
    "grouping_stats_arrays",
    "make_units",
    "make_units_from_config",
    "passage_rows",
    "plan_units",
    "unit_id",
]

_ID_DIGITS = 8
_PREFIX = {"grouped": "g", "document": "d", "passage": "p"}


# -------------------------------------------------------------------------------------------- plan
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
        """As :func:`grouping_stats`."""
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
    ``src -> dst`` (positions) exactly as :func:`make_units` does (each document
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
    :func:`make_units` gives them."""
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
    return document_text(Document(doc_id=str(row["doc_id"]), title=str(row["title"]), text=str(row["text"])))


def passage_rows(row: dict[str, Any], first_unit: int, passage_words: int) -> list[dict[str, Any]]:
    """The passage units of one document row, each a row for :func:`assemble_units`."""
    doc = Document(doc_id=str(row["doc_id"]), title=str(row["title"]), text=str(row["text"]))
    return [{**row, "unit": first_unit + i, "text": t} for i, t in enumerate(document_passages(doc, passage_words))]


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


# ------------------------------------------------------------------------------------- in memory
def make_units(
    docs: Sequence[Document],
    kind: Literal["grouped", "document", "passage"] = "grouped",
    counter: TokenCounter | None = None,
    budget: int = 4096,
    passage_words: int = 100,
    symmetric: bool = True,
) -> list[Unit]:
    """Retrieval units of the chosen granularity (LongRAG, Section 4.2, Table 3) over documents in
    memory: :func:`plan_units` then :func:`assemble_units`, as the distributed build does.

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
    rows = [{"pos": p, "doc_id": d.doc_id, "title": d.title, "text": d.text} for p, d in enumerate(docs)]
    if kind == "passage":
        if passage_words <= 0:
            raise ValueError(f"passage_words must be > 0, got {passage_words}")
        pieces: list[dict[str, Any]] = []
        for row in rows:
            pieces.extend(passage_rows(row, len(pieces), passage_words))
        return assemble_units(kind, pieces, counter)
    if kind == "grouped" and budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    sizes = np.asarray(counter.count_batch([document_text(d) for d in docs]), dtype=np.int64)
    src, dst = link_edges(docs) if kind == "grouped" else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    plan = plan_units(kind, sizes, src, dst, separator_tokens=counter.count(UNIT_SEPARATOR), budget=budget,
                      symmetric=symmetric, n_shards=1)
    for row, unit, n_tok in zip(rows, plan.first_unit.tolist(), sizes.tolist()):
        row.update(unit=unit, n_tokens=n_tok)
    return assemble_units(kind, rows, counter)


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
