"""Stage 2 of the distributed build for corpora without hyperlinks (``units.links``: titles, tfidf,
both): links computed from the parsed-document parts on Ray, the driver holding only the resulting
``(src, dst)`` position arrays, as for hyperlinks (``actors.distbuild.resolve_edges``).

* titles: a Ray Data actor pool; each actor builds one title matcher over all titles (broadcast once
  through the object store, as the hyperlink resolver's title keys) and reads one part at a time.
* tfidf: (1) one Ray task per part reads and tokenizes it once: its hashed-term counts stay in the
  object store, its document frequencies are summed on the driver into one ``tfidf_features``
  array; (2) one Ray task per part weighs its counts into TF-IDF rows (in the object store; the
  driver holds references); (3) Ray Data tasks, one per part of rows, multiply their rows by every
  part's columns in turn and keep a running top-m per row.

The logic is :mod:`longrag.index.titles` and :mod:`longrag.index.links`; this module places it."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from actors.parts import collect_edges, over_parts, part_positions, read_part
from longrag.config import UnitConfig
from longrag.index.links import HashedTfidf

log = logging.getLogger(__name__)


def _texts(table: Any) -> list[str]:
    from longrag.index.grouping import titled_text

    return [titled_text(t, x) for t, x in zip(table.column("title").to_pylist(), table.column("text").to_pylist())]


# ---------------------------------------------------------------------------------------- titles
class MentionFinder:
    """Ray Data callable: parts -> ``(src, dst)`` positions of the titles each document's text mentions."""

    def __init__(self, store_uri: str, shared: list[Any]) -> None:
        from longrag.index.artifacts import ArtifactStore
        from longrag.index.titles import TitleMatcher, title_positions

        self.store = ArtifactStore.open(store_uri)
        titles, (self.keys, self.pos) = ray.get(shared[0])
        titles = titles.to_pylist()
        self.matcher = TitleMatcher(titles)
        self.positions = title_positions(titles)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from longrag.index.titles import mention_positions

        src: list[int] = []
        dst: list[int] = []
        for key, code in zip(batch["key"], batch["code"]):
            table = read_part(self.store, key, ["title", "text"])
            pos = part_positions(self.keys, self.pos, int(code), table.num_rows)
            for p, title, text in zip(pos, table.column("title").to_pylist(), table.column("text").to_pylist()):
                if p >= 0:
                    found = mention_positions(self.matcher, self.positions, title, text)
                    src.extend([int(p)] * len(found))
                    dst.extend(found)
        return {"src": np.asarray(src, dtype=np.int64), "dst": np.asarray(dst, dtype=np.int64)}


def mention_edges(out: str, parts: list[tuple[str, int]], titles: pa.Array,
                  lookup: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    shared = ray.put((titles, lookup))
    return collect_edges(over_parts(parts, MentionFinder, store_uri=out, shared=[shared]), len(titles))


# ---------------------------------------------------------------------------------------- TF-IDF
@ray.remote(num_cpus=1, num_returns=2)
def count_part(store_uri: str, key: str, code: int, n_features: int,
               shared: list[Any]) -> tuple[tuple[Any, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """One part read and tokenized once: its term counts with their corpus positions (kept in the
    object store for :func:`weigh_part`) and its ``(term, df)`` pairs, duplicates left out."""
    from longrag.index.artifacts import ArtifactStore

    keys_sorted, pos_sorted = ray.get(shared[0])
    table = read_part(ArtifactStore.open(store_uri), key, ["title", "text"])
    tfidf = HashedTfidf(n_features)
    counts, pos = tfidf.counts(_texts(table)), part_positions(keys_sorted, pos_sorted, code, table.num_rows)
    return (counts, pos), tfidf.doc_freq(counts, keep=pos >= 0)


@ray.remote(num_cpus=1)
def weigh_part(counted: tuple[Any, np.ndarray], idf: np.ndarray) -> tuple[Any, np.ndarray]:
    """One part's L2-normalized TF-IDF rows and their corpus positions (kept in the object store)."""
    counts, pos = counted
    return HashedTfidf.weigh(counts, idf), pos


def topm_task(batch: dict[str, np.ndarray], parts: list[Any], top_m: int, threshold: float) -> dict[str, np.ndarray]:
    """Ray Data task: row parts (by index into ``parts``) -> ``(src, dst)`` of each row's top-m
    neighbours among all parts, one block of columns at a time."""
    from longrag.index.links import edges_from_neighbours, topm_neighbours

    refs = parts[0]
    src, dst = [], []
    for i in batch["index"]:
        own = ray.get(refs[int(i)])
        blocks = (own if j == int(i) else ray.get(ref) for j, ref in enumerate(refs))
        s, d = edges_from_neighbours(own[1], topm_neighbours(*own, blocks, top_m=top_m, threshold=threshold))
        src.append(s)
        dst.append(d)
    return {"src": np.concatenate(src), "dst": np.concatenate(dst)}


def tfidf_edges(out: str, parts: list[tuple[str, int]], n_docs: int, lookup: tuple[np.ndarray, np.ndarray],
                cfg: UnitConfig) -> tuple[np.ndarray, np.ndarray]:
    shared = [ray.put(lookup)]
    counted, freqs = zip(*(count_part.remote(out, k, c, cfg.tfidf_features, shared) for k, c in parts))
    df = np.zeros(cfg.tfidf_features, dtype=np.int64)
    for ref in freqs:  # a part's (term, df) pairs, summed as they arrive: one array on the driver
        terms, counts = ray.get(ref)
        np.add.at(df, terms, counts)
    idf = ray.put(HashedTfidf.idf(df, n_docs))
    del df
    refs = [weigh_part.remote(c, idf) for c in counted]
    ray.wait(refs, num_returns=len(refs), fetch_local=False)
    del counted
    log.info("TF-IDF rows of %d parts in the object store; top-%d neighbours next", len(refs), cfg.tfidf_top_m)
    rows = ray.data.from_items([{"index": i} for i in range(len(refs))], override_num_blocks=len(refs))
    return collect_edges(rows.map_batches(topm_task, batch_size=1, num_cpus=1, fn_kwargs={
        "parts": [refs], "top_m": cfg.tfidf_top_m, "threshold": cfg.tfidf_threshold}), n_docs)


def computed_edges(out: str, parts: list[tuple[str, int]], titles: pa.Array, lookup: tuple[np.ndarray, np.ndarray],
                   cfg: UnitConfig) -> tuple[np.ndarray, np.ndarray]:
    """The link graph of ``cfg.links`` (titles, tfidf or both) as position arrays ``(src, dst)``."""
    edges = []
    if cfg.links in ("titles", "both"):
        edges.append(mention_edges(out, parts, titles, lookup))
        log.info("title mentions: %d links", edges[-1][0].shape[0])
    if cfg.links in ("tfidf", "both"):
        edges.append(tfidf_edges(out, parts, len(titles), lookup, cfg))
        log.info("TF-IDF neighbours: %d links", edges[-1][0].shape[0])
    if not edges:
        raise ValueError(f"units.links={cfg.links!r} is not computed here (titles, tfidf or both)")
    return np.concatenate([s for s, _ in edges]), np.concatenate([d for _, d in edges])
