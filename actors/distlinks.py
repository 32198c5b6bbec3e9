"""Stage 2 of the distributed build for corpora without hyperlinks (``units.links``: titles, tfidf,
both): links computed from the parsed-document parts on Ray, the driver holding only the resulting
``(src, dst)`` position arrays, as for hyperlinks (``actors.distbuild.resolve_edges``).

* titles: a Ray Data actor pool; each actor builds one title matcher over all titles (broadcast once
  through the object store, as the hyperlink resolver's title keys) and reads one part at a time.
* tfidf: (1) Ray Data tasks count each part's hashed-term document frequencies, summed on the driver
  into one ``tfidf_features`` array; (2) one Ray task per part weighs its rows (the matrix stays in
  the object store, the driver holds references); (3) Ray Data tasks, one per part of rows, multiply
  their rows by every part's columns in turn and keep a running top-m per row.

The logic is :mod:`longrag.index.links`; this module places it."""

from __future__ import annotations

import io
import logging
from typing import Any

import numpy as np
import ray

from longrag.config import UnitConfig
from longrag.index.links import HashedTfidf

log = logging.getLogger(__name__)


def _read_part(store: Any, key: str, columns: list[str]) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(store.storage.read_bytes(str(key))), columns=columns)


def _positions(lookup: tuple[np.ndarray, np.ndarray], code: int, n_rows: int) -> np.ndarray:
    """Corpus positions of a part's rows (-1: a dropped duplicate), from the sorted ``(part, row)`` keys."""
    keys_sorted, pos_sorted = lookup
    keys = np.int64(code) * 65536 + np.arange(n_rows, dtype=np.int64)
    return pos_sorted[np.searchsorted(keys_sorted, keys)]


def _texts(table: Any) -> list[str]:
    return [f"{t}\n{x}" if t else x for t, x in zip(table.column("title").to_pylist(), table.column("text").to_pylist())]


# ---------------------------------------------------------------------------------------- titles
class MentionFinder:
    """Ray Data callable: parts -> ``(src, dst)`` positions of the titles each document's text mentions."""

    def __init__(self, store_uri: str, shared: list[Any]) -> None:
        from longrag.eval.links import TitleMatcher
        from longrag.index.links import title_positions
        from longrag.store import ArtifactStore

        self.store = ArtifactStore.open(store_uri)
        titles, self.lookup = ray.get(shared[0])
        titles = titles.to_pylist()
        self.matcher = TitleMatcher(titles)
        self.positions = title_positions(titles)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from longrag.index.links import mention_positions

        src: list[int] = []
        dst: list[int] = []
        for key, code in zip(batch["key"], batch["code"]):
            table = _read_part(self.store, key, ["title", "text"])
            pos = _positions(self.lookup, int(code), table.num_rows)
            for p, title, text in zip(pos, table.column("title").to_pylist(), table.column("text").to_pylist()):
                if p >= 0:
                    found = mention_positions(self.matcher, self.positions, title, text)
                    src.extend([int(p)] * len(found))
                    dst.extend(found)
        return {"src": np.asarray(src, dtype=np.int64), "dst": np.asarray(dst, dtype=np.int64)}


def mention_edges(out: str, parts: list[tuple[str, int]], titles: list[str],
                  lookup: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa

    shared = ray.put((pa.array(titles, type=pa.string()), lookup))
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    ds = ray.data.from_items([{"key": k, "code": c} for k, c in parts], override_num_blocks=len(parts))
    ds = ds.map_batches(MentionFinder, batch_size=1, fn_constructor_kwargs={"store_uri": out, "shared": [shared]},
                        concurrency=min(cpus, len(parts)), num_cpus=1)
    return _collect(ds)


def _collect(ds: Any) -> tuple[np.ndarray, np.ndarray]:
    src, dst = [], []
    for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
        src.append(b["src"])
        dst.append(b["dst"])
    return (np.concatenate(src) if src else np.zeros(0, np.int64), np.concatenate(dst) if dst else np.zeros(0, np.int64))


# ---------------------------------------------------------------------------------------- TF-IDF
def doc_freq_task(batch: dict[str, np.ndarray], store_uri: str, n_features: int, shared: list[Any]) -> dict[str, np.ndarray]:
    """Ray Data task: parts -> the ``(term, df)`` pairs of their documents (duplicates left out)."""
    from longrag.store import ArtifactStore

    store, tfidf, lookup = ArtifactStore.open(store_uri), HashedTfidf(n_features), ray.get(shared[0])
    terms, dfs = [], []
    for key, code in zip(batch["key"], batch["code"]):
        table = _read_part(store, key, ["title", "text"])
        term, df = tfidf.doc_freq(tfidf.counts(_texts(table)), keep=_positions(lookup, int(code), table.num_rows) >= 0)
        terms.append(term)
        dfs.append(df)
    return {"term": np.concatenate(terms), "df": np.concatenate(dfs)}


@ray.remote(num_cpus=1)
def weigh_part(store_uri: str, key: str, code: int, n_features: int, shared: list[Any]) -> tuple[Any, np.ndarray]:
    """One part's L2-normalized TF-IDF rows and their corpus positions (kept in the object store)."""
    from longrag.store import ArtifactStore

    idf, lookup = ray.get(shared[0])
    table = _read_part(ArtifactStore.open(store_uri), key, ["title", "text"])
    tfidf = HashedTfidf(n_features)
    return tfidf.weigh(tfidf.counts(_texts(table)), idf), _positions(lookup, code, table.num_rows)


def topm_task(batch: dict[str, np.ndarray], parts: list[Any], top_m: int, threshold: float) -> dict[str, np.ndarray]:
    """Ray Data task: row parts (by index into ``parts``) -> ``(src, dst)`` of each row's top-m
    neighbours among all parts, one block of columns at a time."""
    from longrag.index.links import edges_from_neighbours, topm_neighbours

    refs = parts[0]
    src, dst = [], []
    for i in batch["index"]:
        rows, row_pos = ray.get(refs[int(i)])
        blocks = (ray.get(ref) for ref in refs)
        s, d = edges_from_neighbours(row_pos, topm_neighbours(rows, row_pos, blocks, top_m=top_m, threshold=threshold))
        src.append(s)
        dst.append(d)
    return {"src": np.concatenate(src), "dst": np.concatenate(dst)}


def tfidf_edges(out: str, parts: list[tuple[str, int]], n_docs: int, lookup: tuple[np.ndarray, np.ndarray],
                cfg: UnitConfig) -> tuple[np.ndarray, np.ndarray]:
    shared = [ray.put(lookup)]
    ds = ray.data.from_items([{"key": k, "code": c} for k, c in parts], override_num_blocks=len(parts))
    df = np.zeros(cfg.tfidf_features, dtype=np.int64)
    for b in ds.map_batches(doc_freq_task, batch_size=1, num_cpus=1, fn_kwargs={
            "store_uri": out, "n_features": cfg.tfidf_features, "shared": shared}).iter_batches(
            batch_size=None, batch_format="numpy"):
        np.add.at(df, b["term"], b["df"])
    idf = HashedTfidf.idf(df, n_docs)
    del df
    weighed = [ray.put((idf, lookup))]
    refs = [weigh_part.remote(out, k, c, cfg.tfidf_features, weighed) for k, c in parts]
    ray.wait(refs, num_returns=len(refs), fetch_local=False)
    log.info("TF-IDF rows of %d parts in the object store; top-%d neighbours next", len(refs), cfg.tfidf_top_m)
    rows = ray.data.from_items([{"index": i} for i in range(len(refs))], override_num_blocks=len(refs))
    return _collect(rows.map_batches(topm_task, batch_size=1, num_cpus=1, fn_kwargs={
        "parts": [refs], "top_m": cfg.tfidf_top_m, "threshold": cfg.tfidf_threshold}))


def computed_edges(out: str, parts: list[tuple[str, int]], titles: list[str], lookup: tuple[np.ndarray, np.ndarray],
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
