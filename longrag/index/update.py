"""Incremental updates of a build: new, changed and deleted documents -> a new build version that
regroups only the documents whose grouping can change, embeds only the units that changed, and
copies every shard none of whose units changed.

Why regrouping a part gives the same units as a full rebuild: Algorithm 1 (LongRAG, Jiang et al.,
2024, Section 3.1) only merges groups along links, so each connected component of the link graph is
grouped on its own, from its documents' degrees, token counts and relative corpus order alone. The
documents to regroup (:func:`affected_documents`) are the closure of the changed documents under
"same component in the old graph" and "same component in the new graph"; outside that set every
document keeps the same neighbours, degree and relative order (a link among unchanged documents
resolves to the same title's first document, since new documents are appended and changed ones
stay in place), so its groups are the parent build's. The updated corpus is the parent's documents
in their order, a changed document in its place, deleted ones removed, new ones appended:
:func:`apply_changes`, and the order a full rebuild of the same corpus would take.

Unit ids stay stable: a unit whose documents and text equal a parent unit keeps its id (and its
chunks and vectors); a new or changed unit gets the next free id. Units therefore equal a full
rebuild's up to ids (:func:`unit_key`).

No Ray here: the job (``jobs.update``) passes an embedding function.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from longrag.index.grouping import build_adjacency
from longrag.index.units import make_units
from longrag.types import Document, Unit

log = logging.getLogger(__name__)

_PREFIX = {"grouped": "g", "document": "d", "passage": "p"}


class UpdateError(ValueError):
    """Changes that cannot apply to the parent build (unknown ids, a parent that is not the grouping
    of its documents, ...), with the offending values named."""


@dataclass
class Changes:
    """Documents to add or replace (by ``doc_id``), and ids to delete."""

    upserts: list[Document] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)

    def check(self) -> None:
        ids = [d.doc_id for d in self.upserts]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise UpdateError(f"documents added twice in one update: {dup[:10]}")
        both = sorted(set(ids) & set(self.deletes))
        if both:
            raise UpdateError(f"documents both added and deleted in one update: {both[:10]}")


def read_delete_ids(text: str) -> list[str]:
    """Ids of a delete list: one per line; blank lines and ``#`` comments are skipped."""
    return [s for line in text.splitlines() if (s := line.split("#", 1)[0].strip())]


def apply_changes(docs: Sequence[Document], changes: Changes) -> tuple[list[Document], dict[str, list[str]]]:
    """The updated corpus (parent order; a changed document in its place, deleted ones removed, new
    ones appended in the order given) and the ids by kind of change (``added``, ``changed``,
    ``deleted``, ``unchanged`` for upserts equal to the parent's document). Deleting an id the
    corpus does not hold raises :class:`UpdateError` naming it."""
    changes.check()
    by_id = {d.doc_id: i for i, d in enumerate(docs)}
    unknown = [i for i in changes.deletes if i not in by_id]
    if unknown:
        raise UpdateError(f"cannot delete documents the build does not hold: {unknown[:10]}"
                          + (f" (and {len(unknown) - 10} more)" if len(unknown) > 10 else ""))
    out: list[Document | None] = list(docs)
    kinds: dict[str, list[str]] = {"added": [], "changed": [], "deleted": list(changes.deletes), "unchanged": []}
    for i in changes.deletes:
        out[by_id[i]] = None
    appended: list[Document] = []
    for d in changes.upserts:
        if d.doc_id in by_id:
            old = docs[by_id[d.doc_id]]
            same = (old.title, old.text, list(old.links)) == (d.title, d.text, list(d.links))
            kinds["unchanged" if same else "changed"].append(d.doc_id)
            out[by_id[d.doc_id]] = d
        else:
            kinds["added"].append(d.doc_id)
            appended.append(d)
    return [d for d in out if d is not None] + appended, kinds


def _components(docs: Sequence[Document], symmetric: bool) -> np.ndarray:
    """Connected-component label of each document in the link graph (links taken as undirected)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    adj = build_adjacency(docs, symmetric=symmetric)
    n = len(docs)
    rows = np.repeat(np.arange(n), [len(r) for r in adj])
    cols = np.fromiter((j for r in adj for j in r), dtype=np.int64, count=len(rows))
    graph = csr_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(n, n))
    return connected_components(graph, directed=True, connection="weak")[1]


def affected_documents(old_docs: Sequence[Document], new_docs: Sequence[Document], seeds: set[str],
                       symmetric: bool = True) -> set[str]:
    """Ids of the documents to regroup: the changed, added and deleted ids ``seeds`` closed under
    "in the same link-graph component, before or after the change" (see the module docstring)."""
    old_lab, new_lab = _components(old_docs, symmetric), _components(new_docs, symmetric)
    old_ids = [d.doc_id for d in old_docs]
    new_ids = [d.doc_id for d in new_docs]
    old_pos = {d: i for i, d in enumerate(old_ids)}
    new_pos = {d: i for i, d in enumerate(new_ids)}
    old_members: dict[int, list[int]] = {}
    for i, c in enumerate(old_lab.tolist()):
        old_members.setdefault(c, []).append(i)
    new_members: dict[int, list[int]] = {}
    for i, c in enumerate(new_lab.tolist()):
        new_members.setdefault(c, []).append(i)
    out: set[str] = set()
    todo = list(seeds)
    seen_old: set[int] = set()
    seen_new: set[int] = set()
    while todo:
        doc = todo.pop()
        if doc in out:
            continue
        out.add(doc)
        for pos, labels, members, seen, ids in ((old_pos, old_lab, old_members, seen_old, old_ids),
                                                (new_pos, new_lab, new_members, seen_new, new_ids)):
            if doc in pos and (c := int(labels[pos[doc]])) not in seen:
                seen.add(c)
                todo.extend(ids[j] for j in members[c] if ids[j] not in out)
    return out


def corpus_order(docs: list[Document], fmt: str) -> list[Document]:
    """Documents in the order ``jobs.index`` groups them (``actors.build.read_corpus``): a wiki
    export's pages sorted by page id (shorter ids first), other formats as given."""
    if fmt == "wikixml":
        return sorted(docs, key=lambda d: (len(d.doc_id), d.doc_id))
    return list(docs)


def unit_key(u: Unit) -> tuple[tuple[str, ...], str]:
    """What a unit is, without its id: its documents and its text."""
    return tuple(u.doc_ids), u.text


def _id_allocator(prefix: str, taken: set[str]) -> Callable[[], str]:
    numbers = [int(m.group(1)) for t in taken if (m := re.fullmatch(re.escape(prefix) + r"(\d+)", t))]
    state = {"next": max(numbers, default=-1) + 1}

    def next_id() -> str:
        while True:
            uid = f"{prefix}{state['next']:08d}"
            state["next"] += 1
            if uid not in taken:
                taken.add(uid)
                return uid

    return next_id


@dataclass
class UpdatePlan:
    """The units of the updated build and which of them are new, per shard."""

    docs: list[Document]
    units_by_shard: dict[int, list[Unit]]
    new_unit_ids: set[str]
    rebuild: list[int]  # shards whose units changed
    reuse: list[int]  # shards copied from the parent as they are
    kinds: dict[str, list[str]]
    stats: dict[str, Any]

    @property
    def units(self) -> list[Unit]:
        return [u for s in sorted(self.units_by_shard) for u in self.units_by_shard[s]]


def plan_update(
    parent_docs: Sequence[Document],
    parent_units_by_shard: dict[int, Sequence[Unit]],
    changes: Changes,
    *,
    kind: str,
    counter: Any,
    budget: int = 4096,
    passage_words: int = 100,
    symmetric: bool = True,
    links: str = "hyperlinks",
) -> UpdatePlan:
    """Regroup the affected documents of the updated corpus and place the units on shards: a unit
    the parent has (same documents and text) stays on its shard with its id; new units go, largest
    first, onto the shard with the fewest tokens. Raises :class:`UpdateError` when the parent's
    units are not a grouping of ``parent_docs`` (another corpus, or a unit across the affected set)."""
    if kind not in _PREFIX:
        raise UpdateError(f"units.kind must be one of {sorted(_PREFIX)}, got {kind!r}")
    if kind == "grouped" and links != "hyperlinks":
        # title mentions and TF-IDF neighbours (and its document frequencies) change with every
        # document added anywhere: no component of the parent's graph is safe to keep
        raise UpdateError(f"the parent's units were grouped along computed links (units.links={links}), which "
                          "any added or deleted document can change everywhere: rebuild with jobs.index instead")
    t0 = time.perf_counter()
    new_docs, kinds = apply_changes(parent_docs, changes)
    seeds = set(kinds["added"]) | set(kinds["changed"]) | set(kinds["deleted"])
    if kind == "grouped":
        affected = affected_documents(parent_docs, new_docs, seeds, symmetric) if seeds else set()
    else:  # one document's units never depend on another document
        affected = set(seeds)
    parent_units = {u.unit_id: (s, u) for s, us in parent_units_by_shard.items() for u in us}
    covered = [d for _, u in parent_units.values() for d in u.doc_ids]
    if kind != "passage" and (len(covered) != len(set(covered)) or set(covered) != {d.doc_id for d in parent_docs}):
        missing = sorted({d.doc_id for d in parent_docs} - set(covered))[:5]
        extra = sorted(set(covered) - {d.doc_id for d in parent_docs})[:5]
        raise UpdateError(f"the parent's units are not a grouping of its documents (documents without a unit: "
                          f"{missing}, unit documents not in the corpus: {extra}): give the corpus the parent was "
                          "built from")
    # parent units outside the affected set stay; inside it they are regrouped
    kept: dict[int, list[Unit]] = {s: [] for s in parent_units_by_shard}
    redo_keys: dict[tuple[tuple[str, ...], str], tuple[int, Unit]] = {}
    for s, u in parent_units.values():
        inside = [d in affected for d in u.doc_ids]
        if all(inside):
            redo_keys[unit_key(u)] = (s, u)
        elif any(inside):
            raise UpdateError(f"parent unit {u.unit_id} spans documents inside and outside the regrouped set: "
                              "the parent was not grouped by Algorithm 1 over these documents")
        else:
            kept[s].append(u)
    sub = [d for d in new_docs if d.doc_id in affected]
    regrouped = make_units(sub, kind=kind, counter=counter, budget=budget, passage_words=passage_words,
                           symmetric=symmetric) if sub else []
    next_id = _id_allocator(_PREFIX[kind], set(parent_units))
    fresh: list[Unit] = []
    reused = 0
    for u in regrouped:
        old = redo_keys.pop(unit_key(u), None)
        if old is not None:  # the same unit as before: same id, same shard, same chunks and vectors
            kept[old[0]].append(old[1])
            reused += 1
        else:
            fresh.append(Unit(unit_id=next_id(), doc_ids=u.doc_ids, titles=u.titles, text=u.text, n_tokens=u.n_tokens))
    removed_from = {s for s, _ in redo_keys.values()}
    load = {s: sum(u.n_tokens for u in us) for s, us in kept.items()}
    added_to: set[int] = set()
    for u in sorted(fresh, key=lambda u: (-u.n_tokens, u.unit_id)):
        s = min(load, key=lambda s: (load[s], s))
        kept[s].append(u)
        load[s] += u.n_tokens
        added_to.add(s)
    units_by_shard = {s: sorted(us, key=lambda u: u.unit_id) for s, us in kept.items()}
    rebuild = sorted(removed_from | added_to)
    stats = {
        "documents": {k: len(v) for k, v in kinds.items()} | {"total": len(new_docs)},
        "regrouped_documents": len(sub),
        "parent_units_regrouped": len(redo_keys) + reused,
        "units_unchanged_in_regroup": reused,
        "units_removed": len(redo_keys),
        "units_new": len(fresh),
        "units_total": sum(len(v) for v in units_by_shard.values()),
        "shards_rebuilt": rebuild,
        "shards_reused": sorted(set(units_by_shard) - set(rebuild)),
        "plan_s": round(time.perf_counter() - t0, 3),
    }
    log.info("update plan: %s", stats)
    return UpdatePlan(docs=new_docs, units_by_shard=units_by_shard, new_unit_ids={u.unit_id for u in fresh},
                      rebuild=rebuild, reuse=stats["shards_reused"], kinds=kinds, stats=stats)


def stored_vectors(index: Any) -> np.ndarray | None:
    """The exact chunk vectors a FAISS index holds uncompressed (Flat, HNSW-Flat, IVF-Flat, a
    ``RFlat`` re-ranking stage), in FAISS id order; None for lossy codes (SQ, PQ), whose chunks are
    embedded again when their shard is rebuilt."""
    import faiss

    concrete = faiss.downcast_index(index)
    if isinstance(concrete, faiss.IndexRefine):
        return stored_vectors(concrete.refine_index)
    if isinstance(concrete, faiss.IndexHNSW):
        return stored_vectors(concrete.storage)
    if isinstance(concrete, faiss.IndexIVFFlat):
        concrete.make_direct_map()
        return concrete.reconstruct_n(0, concrete.ntotal)
    if isinstance(concrete, faiss.IndexFlat):
        return concrete.reconstruct_n(0, concrete.ntotal)
    return None


def write_update(
    parent: Any,
    out: Any,
    plan: UpdatePlan,
    *,
    embed: Callable[[list[str]], np.ndarray],
    counter: Any,
    max_tokens: int,
    build_id: str | None = None,
    command: list[str] | None = None,
) -> Any:
    """Write the updated build at ``out`` (an empty :class:`longrag.index.artifacts.ArtifactStore`) from the
    complete build ``parent``: shards in ``plan.reuse`` are copied (sha256-checked), the others are
    rebuilt from the parent's chunks and vectors of their kept units plus the chunks of the new
    units, embedded with ``embed``. The manifest names the parent (``Manifest.parent``) and is
    written complete last. Returns it."""
    from longrag.index.artifacts import (
        DOCUMENTS_FILE,
        copy_shard,
        load_shard,
        load_shard_chunks,
        write_documents,
        write_shard,
        write_unit_graph,
    )
    from longrag.index.chunking import chunk_units
    from longrag.index.graph import GRAPH_FILE, links_units, unit_graph_from_documents
    from longrag.index.manifest import ParentBuild, collect_provenance, new_build_id, shard_plan, utc_now
    from longrag.index.maxp import MaxPIndex
    from longrag.types import Chunk

    t0 = time.perf_counter()
    pm = parent.read_manifest()
    if pm.status != "complete":
        raise UpdateError(f"the parent build {pm.build_id} at {parent.uri} is not complete (status {pm.status!r})")
    manifest = pm.model_copy(deep=True)
    manifest.build_id, manifest.created_at, manifest.status = build_id or new_build_id(), utc_now(), "building"
    manifest.shards, manifest.artifacts = [], {}
    manifest.counts.documents = len(plan.docs)
    manifest.plan = shard_plan(plan.units_by_shard)
    manifest.provenance = collect_provenance(command)
    manifest.parent = ParentBuild(
        build_id=pm.build_id, uri=parent.uri, changes={k: len(v) for k, v in plan.kinds.items()},
        units={"new": plan.stats["units_new"], "removed": plan.stats["units_removed"],
               "regrouped": plan.stats["parent_units_regrouped"]},
        shards_rebuilt=plan.rebuild, shards_reused=plan.reuse)
    out.write_manifest(manifest)
    embedded = reembedded = 0
    for s in plan.reuse:
        manifest.add_shard(copy_shard(parent, out, s))
    for s in plan.rebuild:
        units = plan.units_by_shard[s]
        keep = {u.unit_id for u in units} - plan.new_unit_ids
        chunks: list[Chunk] = []
        vectors: list[np.ndarray] = []
        if keep and s in pm.shard_ids:
            old_index, _ = load_shard(parent, s)
            old_chunks = load_shard_chunks(parent, s)
            rows = [i for i, u in enumerate(old_index.chunk_units.tolist()) if str(old_index.unit_ids[u]) in keep]
            kept_chunks = old_chunks.get_many([str(old_index.chunk_ids[i]) for i in rows])
            stored = stored_vectors(old_index.index)
            if stored is not None:
                vectors.append(stored[rows])
            else:  # lossy codes: embed the kept chunks again rather than index decoded vectors
                vectors.append(embed([c.text for c in kept_chunks]))
                reembedded += len(kept_chunks)
            chunks.extend(kept_chunks)
        new_chunks = chunk_units([u for u in units if u.unit_id in plan.new_unit_ids], max_tokens, counter)
        if new_chunks:
            vectors.append(embed([c.text for c in new_chunks]))
            embedded += len(new_chunks)
            chunks.extend(new_chunks)
        bad = [v.shape for v in vectors if v.ndim != 2 or v.shape[1] != pm.embedding.dim]
        if bad:
            raise UpdateError(f"the embedding gives vectors of shape {bad[0]}, the parent build's "
                              f"{pm.embedding.model} has {pm.embedding.dim} dimensions: embed with the parent's model")
        matrix = np.concatenate(vectors).astype(np.float32) if vectors else np.zeros((0, pm.embedding.dim), np.float32)
        order = sorted(range(len(chunks)), key=lambda i: (chunks[i].unit_id, chunks[i].position))
        chunks = [chunks[i] for i in order]
        index = MaxPIndex.build(np.ascontiguousarray(matrix[order]), [c.chunk_id for c in chunks],
                                [c.unit_id for c in chunks], factory=pm.factory, metric=pm.metric)
        manifest.add_shard(write_shard(out, s, units, chunks, index))
    manifest.artifacts[DOCUMENTS_FILE] = write_documents(out, plan.docs)
    # the links of every unit again: an added document links kept units too (a few ms per 10K units)
    shard_of = [s for s in sorted(plan.units_by_shard) for _ in plan.units_by_shard[s]]
    linked = links_units(pm.config.get("units", {}).get("kind", "grouped"))
    graph = unit_graph_from_documents(plan.docs, plan.units, shard_of, linked=linked)
    manifest.artifacts[GRAPH_FILE] = write_unit_graph(out, graph)
    manifest.mark_complete()
    report = {"build_id": manifest.build_id, "parent": pm.build_id, **plan.stats, "chunks_embedded": embedded,
              "kept_chunks_reembedded": reembedded, "write_s": round(time.perf_counter() - t0, 2)}
    out.storage.write_bytes("build_report.json", json.dumps(report, indent=2).encode())
    out.write_manifest(manifest)  # written last: the build is complete only now
    return manifest
