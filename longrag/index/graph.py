"""The unit link graph and graph expansion (``retrieval.mode=graph`` / ``hybrid+graph``).

Units link where their documents link: the build contracts the document link graph (the one
LongRAG's grouping walks, :func:`longrag.index.grouping.link_edges`) onto the units, drops the
links inside a unit and keeps the rest as one symmetric CSR, written once per build beside the
shards (``unit_graph.parquet``: a row per unit, its id, shard and neighbours).

At query time a Personalized PageRank seeded by the first stage's best units re-ranks the first
stage's candidates together with the units near the seeds (HippoRAG's idea, Gutierrez et al.,
2024, on LongRAG's units, with the project's own kernel,
:func:`longrag.mixpr.pagerank.personalized_pagerank`). The walk runs on the seeds' neighbourhood
only (every unit within ``radius`` links of a seed, at most ``max_nodes``), so its cost depends on
the neighbourhood, not on the corpus; with a radius that covers the seeds' connected component it
is the PPR of the whole graph, whose mass never leaves that component.

Where the graph lives: with the Retriever (the shards hold chunks and units; the walk needs the
edges across them), read on a build's first graph request: ~175 MB per million units with ~8
links each, a walk p50 9 ms (``python -m jobs.bench graph``; docs/evaluation.md).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from longrag.index.grouping import csr_from_edges, link_edges
from longrag.mixpr.pagerank import personalized_pagerank
from longrag.types import Document, InvalidRequest, Unit, UnitHit

if TYPE_CHECKING:
    from longrag.config import RetrievalConfig

__all__ = ["GRAPH_FILE", "GraphExpansion", "GraphMissing", "UnitGraph", "expand", "split_mode",
           "links_units", "unit_graph_from_documents", "unit_graph_from_labels"]

GRAPH_FILE = "unit_graph.parquet"


class GraphMissing(InvalidRequest):
    """``retrieval.mode=graph`` on a build written without its unit graph."""

    def __init__(self, build_id: str) -> None:
        super().__init__(f"retrieval.mode=graph needs the unit link graph, and build {build_id} was written without it "
                         "(built before graph expansion): rebuild it with jobs.index (or jobs.update), or use mode=dense")


def split_mode(mode: str) -> tuple[bool, bool]:
    """``(hybrid, graph)`` of a ``retrieval.mode`` other than iterative: ``hybrid+graph`` is both."""
    return mode in ("hybrid", "hybrid+graph"), mode in ("graph", "hybrid+graph")


GRAPH_SCHEMA = pa.schema([("unit_id", pa.string()), ("shard", pa.int32()), ("links", pa.list_(pa.int32()))])


@dataclass(frozen=True)
class UnitGraph:
    """Units (``unit_ids[i]`` on shard ``shards[i]``) and their links as CSR rows: the neighbours of
    unit ``i`` are ``indices[indptr[i]:indptr[i + 1]]`` (sorted, symmetric, no self loops)."""

    unit_ids: list[str]
    shards: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.unit_ids)
        if self.shards.shape != (n,) or self.indptr.shape != (n + 1,):
            raise ValueError(f"{n} units but {self.shards.shape[0]} shards and {self.indptr.shape[0]} row bounds")
        if int(self.indptr[-1]) != self.indices.shape[0]:
            raise ValueError(f"row bounds end at {int(self.indptr[-1])}, {self.indices.shape[0]} neighbours stored")

    @property
    def n_units(self) -> int:
        return len(self.unit_ids)

    @property
    def n_links(self) -> int:
        """Undirected links (each is stored at both ends)."""
        return int(self.indices.shape[0]) // 2

    @cached_property
    def position(self) -> dict[str, int]:
        return {u: i for i, u in enumerate(self.unit_ids)}

    @cached_property
    def matrix(self) -> sp.csr_matrix:
        """The adjacency as a scipy CSR (one byte per link end beside the shared index arrays)."""
        data = np.ones(self.indices.shape[0], dtype=np.uint8)
        return sp.csr_matrix((data, self.indices, self.indptr), shape=(self.n_units, self.n_units), copy=False)

    def nbytes(self) -> int:
        """Bytes this graph holds now: its arrays, the id strings and their list, and the id lookup
        and scipy CSR once a walk has built them (a count of the objects, not a sampled RSS)."""
        arrays = [self.shards, self.indptr, self.indices]
        total = sys.getsizeof(self.unit_ids) + sum(sys.getsizeof(u) for u in self.unit_ids)
        if "position" in self.__dict__:  # keys are the strings counted above; ints past 256 are objects
            total += sys.getsizeof(self.position) + sum(sys.getsizeof(i) for i in range(257, self.n_units))
        if "matrix" in self.__dict__:
            m = self.matrix
            arrays += [a for a in (m.data, m.indices, m.indptr)
                       if not any(np.shares_memory(a, b) for b in (self.indices, self.indptr))]
        return total + sum(int(a.nbytes) for a in arrays)

    def neighbours(self, i: int) -> np.ndarray:
        return self.indices[self.indptr[i] : self.indptr[i + 1]]

    def to_parquet(self) -> bytes:
        offsets = pa.array(self.indptr.astype(np.int32) if self.indices.shape[0] < 2**31 else self.indptr)
        links = pa.ListArray.from_arrays(offsets, pa.array(self.indices.astype(np.int32)))
        table = pa.table({"unit_id": pa.array(self.unit_ids, pa.string()),
                          "shard": pa.array(self.shards.astype(np.int32)), "links": links}, schema=GRAPH_SCHEMA)
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        return sink.getvalue()

    @classmethod
    def from_parquet(cls, data: bytes) -> UnitGraph:
        table = pq.read_table(io.BytesIO(data)).combine_chunks()
        if table.schema.names != GRAPH_SCHEMA.names:
            raise ValueError(f"a unit graph has columns {GRAPH_SCHEMA.names}, got {table.schema.names}")
        links = table.column("links").chunk(0) if table.num_rows else pa.array([], pa.list_(pa.int32()))
        indptr = np.asarray(links.offsets, dtype=np.int64) if table.num_rows else np.zeros(1, np.int64)
        indices = np.asarray(links.values, dtype=np.int32) if table.num_rows else np.zeros(0, np.int32)
        indptr = indptr - indptr[0]  # a sliced list array's offsets start where the slice does
        return cls(unit_ids=table.column("unit_id").to_pylist(), shards=table.column("shard").to_numpy().astype(np.int32),
                   indptr=indptr, indices=indices[: int(indptr[-1])] if indptr.shape[0] else indices)


def unit_graph_from_labels(unit_ids: Sequence[str], shards: Sequence[int] | np.ndarray, unit_of_doc: np.ndarray,
                           src: np.ndarray, dst: np.ndarray) -> UnitGraph:
    """Contract document links ``src -> dst`` (document positions) onto units: ``unit_of_doc[p]`` is
    the position (in ``unit_ids``) of document ``p``'s unit, or -1 for a document in no unit.
    Links inside a unit are dropped; each pair of units is linked once, both ways."""
    unit_of_doc = np.asarray(unit_of_doc, dtype=np.int64)
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    a, b = unit_of_doc[src], unit_of_doc[dst]
    keep = (a >= 0) & (b >= 0)
    indptr, indices = csr_from_edges(len(unit_ids), a[keep], b[keep], symmetric=True, what="unit links")
    return UnitGraph(unit_ids=list(unit_ids), shards=np.asarray(shards, dtype=np.int32), indptr=indptr,
                     indices=indices.astype(np.int32))


def links_units(unit_kind: str) -> bool:
    """Whether a build of ``unit_kind`` units links them: only grouping resolves the corpus' links
    (the distributed path resolves none for document or passage units, so no path does)."""
    return unit_kind == "grouped"


def unit_graph_from_documents(docs: Sequence[Document], units: Sequence[Unit], shards: Sequence[int],
                              linked: bool = True) -> UnitGraph:
    """The unit graph of ``units`` (on ``shards``) over the documents they were grouped from (a
    document's first unit stands for it). ``linked=False``: the units without links, as a build of
    document or passage units keeps them (only grouping resolves the corpus' links)."""
    pos = {d.doc_id: p for p, d in enumerate(docs)}
    first: dict[int, int] = {}
    for i, u in enumerate(units):
        for d in u.doc_ids:
            if d in pos:
                first.setdefault(pos[d], i)
    unit_of_doc = np.full(len(docs), -1, dtype=np.int64)
    for p, i in first.items():
        unit_of_doc[p] = i
    src, dst = link_edges(docs) if linked else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    return unit_graph_from_labels([u.unit_id for u in units], shards, unit_of_doc, src, dst)


@dataclass(frozen=True)
class GraphExpansion:
    """``retrieval.graph_*``: the first stage's top ``seeds`` units restart the walk (weights
    ``exp(temperature * z)``, ``z`` the first-stage score min-max scaled over the candidates);
    ``alpha`` is the restart probability; the final score is ``(1 - blend) z + blend x / max x``
    (``x`` the PPR); the walk covers the units within ``radius`` links of a seed, ``max_nodes`` at most."""

    seeds: int = 4
    alpha: float = 0.5
    blend: float = 0.5
    depth: int = 50
    radius: int = 2
    max_nodes: int = 2000
    temperature: float = 5.0

    @classmethod
    def of(cls, retrieval: RetrievalConfig) -> GraphExpansion:
        return cls(seeds=retrieval.graph_seeds, alpha=retrieval.graph_alpha, blend=retrieval.graph_blend,
                   depth=retrieval.graph_depth, radius=retrieval.graph_radius, max_nodes=retrieval.graph_max_nodes)

    def first_stage_k(self, k: int) -> int:
        """Units the first stage returns for a top-``k`` answer: its candidates for the walk."""
        return max(k, self.depth)

    def __post_init__(self) -> None:
        if self.seeds < 1 or self.depth < 1 or self.radius < 0 or self.max_nodes < 1:
            raise ValueError(f"seeds, depth and max_nodes must be >= 1 and radius >= 0, got {self}")
        if not (0.0 < self.alpha <= 1.0 and 0.0 <= self.blend <= 1.0):
            raise ValueError(f"alpha must lie in (0, 1] and blend in [0, 1], got {self.alpha}, {self.blend}")


def _scaled(scores: np.ndarray) -> np.ndarray:
    lo, hi = float(scores.min()), float(scores.max())
    return (scores - lo) / (hi - lo) if hi > lo else np.ones_like(scores)


def _neighbours_of(graph: UnitGraph, rows: np.ndarray, budget: int) -> np.ndarray:
    """The neighbours of the units in ``rows``, least linked first, at most ``budget`` of them (so
    a hub with thousands of links adds what the budget leaves; its share of the walk is small)."""
    counts = graph.indptr[rows + 1] - graph.indptr[rows]
    order = np.argsort(counts, kind="stable")
    rows, counts = rows[order], counts[order]
    keep = int(np.searchsorted(np.cumsum(counts), budget, side="right")) + 1
    rows, counts = rows[:keep], counts[:keep]
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(rows.shape[0]), counts)
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    return graph.indices[graph.indptr[rows][owner] + offsets][:budget].astype(np.int64)


def _neighbourhood(graph: UnitGraph, seeds: list[int], radius: int, limit: int) -> np.ndarray:
    """Units within ``radius`` links of the seeds, breadth first, the seeds first; over ``limit``
    the nearest are kept (within one distance, the neighbours of the least linked units first,
    then the lowest positions). Each step reads at most ``4 * limit`` links."""
    seen = np.asarray(list(dict.fromkeys(seeds)), dtype=np.int64)[:limit]
    frontier = seen
    for _ in range(radius):
        if seen.shape[0] >= limit or frontier.shape[0] == 0:
            break
        nxt = np.sort(_neighbours_of(graph, frontier, 4 * limit))  # unique, not yet seen (np.unique hashes: slower)
        nxt = nxt[np.concatenate(([True], nxt[1:] != nxt[:-1]))] if nxt.shape[0] else nxt
        nxt = nxt[~np.isin(nxt, seen, kind="sort")]
        frontier = nxt[: limit - seen.shape[0]]
        seen = np.concatenate([seen, frontier])
    return seen


def _subgraph(graph: UnitGraph, nodes: np.ndarray) -> sp.csr_matrix:
    """The links among ``nodes`` (positions in the graph) as a CSR over their order in ``nodes``."""
    return graph.matrix[nodes][:, nodes].tocsr().astype(np.float64)


def expand(hits: Sequence[UnitHit], graph: UnitGraph, k: int, settings: GraphExpansion = GraphExpansion()) -> list[UnitHit]:
    """The top ``k`` of the first stage's ``hits`` (best first, up to ``settings.depth`` used) and the
    units near its best ones, ranked by first-stage score blended with Personalized PageRank (see
    :class:`GraphExpansion`). A hit keeps its best chunk and says who found it (its first-stage
    ``found_by``, ``dense`` when unset); a unit only the walk reached has ``found_by="graph"``, no
    best chunk (``best_chunk_id=""``: its shard picks one) and its score from the walk alone.
    Hits whose unit the graph does not hold (a build older than its graph) take part unlinked."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    first = list(hits[: settings.first_stage_k(k)])
    if not first:
        return []
    pos = graph.position
    cand = [pos.get(h.unit_id, -1) for h in first]
    seeds = [c for c in cand[: settings.seeds] if c >= 0]
    z = _scaled(np.asarray([h.score for h in first], dtype=np.float64))
    if not seeds or settings.blend == 0.0:
        return [replace(h, found_by=h.found_by or "dense") for h in first[:k]]
    near = _neighbourhood(graph, seeds, settings.radius, settings.max_nodes).tolist()
    nodes = list(dict.fromkeys([c for c in cand if c >= 0] + near))
    local = {g: i for i, g in enumerate(nodes)}
    sub = _subgraph(graph, np.asarray(nodes, dtype=np.int64))
    p = np.zeros(len(nodes))
    for c, zc in zip(cand[: settings.seeds], z[: settings.seeds]):
        if c >= 0:
            p[local[c]] += np.exp(settings.temperature * (zc - 1.0))
    x = personalized_pagerank(sub, p / p.sum(), settings.alpha, max_iter=200, tol=1e-10).scores  # small: converge
    x = x / x.max() if x.max() > 0 else x
    # every node's score: a candidate's blends its first-stage score, a unit only the walk reached has the walk's
    first_z = np.zeros(len(nodes))
    is_candidate = np.zeros(len(nodes), dtype=bool)
    slot = np.full(len(nodes), -1, dtype=np.int64)  # the node's first-stage rank
    for rank, c in enumerate(cand):
        if c >= 0 and slot[local[c]] < 0:
            slot[local[c]], first_z[local[c]], is_candidate[local[c]] = rank, z[rank], True
    final = (1 - settings.blend) * first_z + settings.blend * x
    unlinked = [(float((1 - settings.blend) * z[r]), r) for r, c in enumerate(cand) if c < 0]
    tie = np.where(is_candidate, slot, len(first) + np.arange(len(nodes)))
    reached = is_candidate | (x > 0)
    order = np.lexsort((tie, -final))
    ranked = [(float(final[i]), int(tie[i]), int(i)) for i in order[reached[order]][: k + len(unlinked)]]
    ranked += [(sc, r, -1) for sc, r in unlinked]
    ranked.sort(key=lambda t: (-t[0], t[1]))
    out = []
    for score, tie_rank, i in ranked[:k]:
        if i < 0 or is_candidate[i]:
            h = first[tie_rank]
            out.append(replace(h, score=score, found_by=h.found_by or "dense"))
        else:
            g = nodes[i]
            out.append(UnitHit(unit_id=graph.unit_ids[g], score=score, best_chunk_id="", shard=int(graph.shards[g]),
                               found_by="graph"))
    return out
