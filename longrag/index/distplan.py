"""The plan of a distributed index build on arrays: the driver holds document metadata, never a text.

Workers parse the corpus and write the documents to the build's ``documents/`` parquet parts; the
driver gets back, per document, where it was written (part, row), its id, title and token count
(:class:`DocMeta`), and, from a second pass over the parts, its links as document positions. That is
what LongRAG's grouping needs (Jiang et al., 2024, Section 3.1, Algorithm 1): token counts and the
link graph: ids and titles as Arrow strings, a few integers per document, 8 bytes per link.

- :func:`order_documents` puts documents in the order the in-driver path reads them (wiki page ids
  numerically, JSONL/parquet in file and line order) and drops later duplicates of a ``doc_id``;
- :func:`final_redirects` / :func:`resolve_links` resolve link titles against
  :func:`longrag.index.grouping.title_keys` the way :func:`longrag.index.grouping.link_edges` and
  :func:`longrag.corpus.wikititles.resolve_redirects` do, on a worker, from broadcast tables;
- the units are planned and assembled by :mod:`longrag.index.units` (:func:`~longrag.index.units.plan_units`
  on the driver, :func:`~longrag.index.units.assemble_units` per shard on workers), the path every
  build takes; this module stages them (:func:`stage_shard_units`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from longrag.index.grouping import link_positions
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
    from longrag.records import units_to_parquet

    n = staged_parts(len(units))
    for k in range(n):
        storage.write_bytes(staged_units_key(shard, k), units_to_parquet(list(units[k * UNITS_PER_PART : (k + 1) * UNITS_PER_PART])))
    return n


def staged_chunks_prefix(shard: int) -> str:
    """Store prefix of a shard's embedded chunks (parquet parts) before the shard is built."""
    return f"{STAGING_PREFIX}chunks/shard-{shard:05d}/"


def staged_chunks_key(shard: int, chunk_ids: Sequence[str]) -> str:
    """Key of a staged part of a shard's embedded chunks, named by the chunks it holds:
    ``part-<sha256 of the chunk ids, in order; 32 hex digits>.parquet``. The same chunks written
    again (a Ray task retried after its worker died, or re-run to reconstruct a lost block) land
    on the same key and replace the part instead of duplicating its chunks."""
    digest = hashlib.sha256("\n".join(chunk_ids).encode("utf-8")).hexdigest()[:32]
    return f"{staged_chunks_prefix(shard)}part-{digest}.parquet"


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
    def concat(cls, tables: Sequence[pa.Table]) -> DocMeta:
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


def final_redirects(redirects: dict[str, str]) -> dict[str, str]:
    """Each redirect source -> the title at the end of its chain
    (:func:`longrag.corpus.wikititles.resolve_title`: a cycle leaves the title as it is)."""
    from longrag.corpus.wikititles import normalize_title as wiki_title
    from longrag.corpus.wikititles import resolve_title

    red = {wiki_title(k): wiki_title(v) for k, v in redirects.items()}
    return {k: resolve_title(k, red) for k in red}


def resolve_links(
    title: str, links: Sequence[str], keys: dict[str, int], redirects: dict[str, str] | None
) -> list[int]:
    """Positions of the documents ``links`` point to. With ``redirects`` (a wiki export: the map of
    :func:`final_redirects`), links go through them and a link that lands on the document's own title
    is dropped, as :func:`longrag.corpus.wikititles.resolve_redirects` does; links to titles outside the
    corpus are dropped, duplicates and self-loops are left to the graph builder."""
    if redirects is not None:
        from longrag.corpus.wikititles import normalize_title as wiki_title

        own = wiki_title(title)
        resolved = []
        for t in links:
            t = wiki_title(t)
            t = redirects.get(t, t)
            if t != own:
                resolved.append(t)
        links = resolved
    return link_positions(links, keys)
