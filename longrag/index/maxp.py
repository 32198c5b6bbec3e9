"""MaxP index: a unit's score is the best score of any of its chunks (LongRAG,
Jiang et al., 2024, "LongRAG: Enhancing Retrieval-Augmented Generation with Long-context LLMs",
Section 3.1, "Similarity search").

One :class:`MaxPIndex` holds one shard: a FAISS index over chunk vectors plus the chunk -> unit
map. A shard answers "top-k units" exactly: it searches the top k' chunks and doubles k' until the
k best units are certain (README, Architecture: "A unit never spans shards"), so the scatter/gather
client only has to merge the shards' lists with :func:`merge_topk`.

With an approximate factory (IVF, HNSW, PQ) the same loop runs on the index's own (approximate)
ranking and stops as soon as the index returns fewer chunks than asked (its probes are used up);
the result is then approximate. ``set_search_params`` tunes the trade (``nprobe``, ``efSearch``);
``jobs.bench index`` measures recall against exact search, memory and latency per factory.

Scores are "higher is better" everywhere: the inner product for ``metric="ip"`` and the negated
squared L2 distance for ``metric="l2"``. Ties are broken by ``unit_id`` (ascending), and a unit's
best chunk among equal-scoring chunks is the one added first.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from longrag.index import torch_search
from longrag.types import UnitHit

Metric = Literal["ip", "l2"]

#: File names a saved index consists of (all inside one shard folder).
INDEX_FILE = "index.faiss"
CHUNK_UNITS_FILE = "chunk_units.npy"
CHUNK_IDS_FILE = "chunk_ids.parquet"
UNIT_IDS_FILE = "unit_ids.parquet"
META_FILE = "maxp.json"
INDEX_FILES = (INDEX_FILE, CHUNK_UNITS_FILE, CHUNK_IDS_FILE, UNIT_IDS_FILE, META_FILE)

_FAISS_METRIC = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}

#: Largest k a FAISS GPU index searches (``GPU_MAX_SELECTION_K``); MaxP's wider searches run on the CPU copy.
GPU_MAX_K = 2048


class IndexDeviceError(ValueError):
    """``index.device=cuda`` where FAISS cannot search on a GPU (a configuration error, not a crash)."""


def check_gpu(gpu: int = 0, exact: bool = True) -> None:
    """Raise :class:`IndexDeviceError` unless GPU ``gpu`` can search: FAISS with GPU support that sees it,
    or, for ``exact`` (Flat) shards, torch that sees it (:mod:`longrag.index.torch_search`)."""
    if not hasattr(faiss, "StandardGpuResources"):
        if exact and torch_search.cuda_devices() > gpu:
            return
        raise IndexDeviceError(
            f"index.device=cuda needs a GPU that torch sees (exact Flat shards: the gpu extra, pip install "
            f"'longrag[gpu]') or FAISS with GPU support (IVF/PQ shards), but this FAISS {faiss.__version__} is a "
            f"CPU-only build and torch sees {torch_search.cuda_devices()} GPU(s); run the shards on a GPU node "
            "or set index.device=cpu"
        )
    n = faiss.get_num_gpus()
    if gpu >= n:
        raise IndexDeviceError(
            f"index.device=cuda: FAISS sees {n} GPU(s), so GPU {gpu} is not available (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}); give shard actors a GPU (index.shard_num_gpus) on a "
            "node with one, or set index.device=cpu"
        )


def _check_matrix(x: np.ndarray, name: str, dim: int | None = None) -> np.ndarray:
    """Validate a float32 2-D matrix (and its width) and return it C-contiguous."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n, d), got shape {x.shape}")
    if x.dtype != np.float32:
        raise ValueError(f"{name} must be float32, got {x.dtype}")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} has dimension {x.shape[1]}, the index has {dim}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")
    return np.ascontiguousarray(x)


def _strings(values: Sequence[str] | np.ndarray, name: str, n: int) -> np.ndarray:
    arr = np.asarray(list(values), dtype=object)
    if arr.ndim != 1 or len(arr) != n:
        raise ValueError(f"{name} must hold {n} strings, got {len(arr)}")
    if n and not all(isinstance(v, str) for v in arr):
        raise ValueError(f"{name} must hold strings")
    return arr


def skip_polysemous_training(index: Any) -> int:
    """Turn off the polysemous training of every PQ inside ``index`` (IVF-PQ, PQ, under a refine or
    a pre-transform); returns how many. FAISS does it by default for 8-bit PQ codes: it permutes the
    centroids so that code Hamming distances approximate the real ones, which only polysemous search
    (``polysemous_ht`` > 0) uses. The distances this index ranks by are the same without it, and
    training is ~20x faster (IVF16,PQ8 on 4,000 x 64: 15 s -> 0.7 s)."""
    seen, found, todo = set(), 0, [index]
    while todo:
        ix = faiss.downcast_index(todo.pop())
        if ix is None or id(ix) in seen:
            continue
        seen.add(id(ix))
        if hasattr(ix, "do_polysemous_training"):
            ix.do_polysemous_training = False
            found += 1
        todo += [getattr(ix, name) for name in ("base_index", "index") if getattr(ix, name, None) is not None]
    return found


class MaxPIndex:
    """FAISS index over chunk vectors with an int32 chunk -> unit-ordinal map.

    ``chunk_units[i]`` is the ordinal (into ``unit_ids``) of the unit that owns the chunk with
    FAISS id ``i``; ``chunk_ids[i]`` is that chunk's id.
    """

    def __init__(
        self,
        index: faiss.Index,
        chunk_units: np.ndarray,
        unit_ids: np.ndarray,
        chunk_ids: np.ndarray,
        metric: Metric,
        factory: str,
    ) -> None:
        if metric not in _FAISS_METRIC:
            raise ValueError(f"metric must be 'ip' or 'l2', got {metric!r}")
        if index.metric_type != _FAISS_METRIC[metric]:
            raise ValueError(f"FAISS index metric {index.metric_type} does not match metric={metric!r}")
        chunk_units = np.asarray(chunk_units)
        if chunk_units.dtype != np.int32 or chunk_units.ndim != 1:
            raise ValueError(f"chunk_units must be a 1-D int32 array, got {chunk_units.dtype} {chunk_units.shape}")
        if len(chunk_units) != index.ntotal or len(chunk_ids) != index.ntotal:
            raise ValueError(
                f"index holds {index.ntotal} vectors but the maps hold {len(chunk_units)} units / "
                f"{len(chunk_ids)} chunk ids"
            )
        if len(chunk_units) and (chunk_units.min() < 0 or chunk_units.max() >= len(unit_ids)):
            raise ValueError("chunk_units holds ordinals outside unit_ids")
        self.index = index
        self.chunk_units = chunk_units
        self.unit_ids = np.asarray(unit_ids, dtype=object)
        self.chunk_ids = np.asarray(chunk_ids, dtype=object)
        self.metric: Metric = metric
        self.factory = factory
        self._unit_pos: tuple[dict[str, int], np.ndarray, np.ndarray] | None = None  # unit_chunk_scores' map
        self._cpu_index: faiss.Index | None = None  # set by to_gpu: the CPU copy for searches beyond GPU_MAX_K

    # ------------------------------------------------------------------ build
    @classmethod
    def build(
        cls,
        vectors: np.ndarray,
        chunk_ids: Sequence[str],
        unit_ids: Sequence[str],
        factory: str = "Flat",
        metric: Metric = "ip",
    ) -> MaxPIndex:
        """Index ``vectors`` (float32 (n, d)); ``unit_ids[i]`` owns chunk ``chunk_ids[i]``.

        Non-exact factories (IVF, PQ, ...) are trained on ``vectors`` first.
        """
        vectors = _check_matrix(vectors, "vectors")
        n, dim = vectors.shape
        if dim == 0:
            raise ValueError("vectors must have at least one dimension")
        if metric not in _FAISS_METRIC:
            raise ValueError(f"metric must be 'ip' or 'l2', got {metric!r}")
        chunk_arr = _strings(chunk_ids, "chunk_ids", n)
        unit_arr = _strings(unit_ids, "unit_ids", n)
        if len(set(chunk_arr.tolist())) != n:
            raise ValueError("chunk_ids must be unique")
        # Unit ordinals in order of first appearance.
        uniq, first, inverse = np.unique(unit_arr.astype(str), return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        units = np.asarray(uniq[order].tolist(), dtype=object)
        chunk_units = rank[inverse.reshape(-1)].astype(np.int32)

        index = faiss.index_factory(dim, factory, _FAISS_METRIC[metric])
        if not index.is_trained:
            if n == 0:
                raise ValueError(f"factory {factory!r} needs training vectors, got none")
            skip_polysemous_training(index)
            index.train(vectors)
        if n:
            index.add(vectors)
        return cls(index, chunk_units, units, chunk_arr, metric, factory)

    # ------------------------------------------------------------------ properties
    @property
    def ntotal(self) -> int:
        """Number of chunk vectors."""
        return int(self.index.ntotal)

    @property
    def n_units(self) -> int:
        return int(len(self.unit_ids))

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def __repr__(self) -> str:
        return (
            f"MaxPIndex(factory={self.factory!r}, metric={self.metric!r}, dim={self.dim}, "
            f"ntotal={self.ntotal}, n_units={self.n_units})"
        )

    # ------------------------------------------------------------------ device
    @property
    def device(self) -> str:
        return "cuda" if self._cpu_index is not None else "cpu"

    def to_gpu(self, gpu: int = 0) -> None:
        """Move the FAISS index to GPU ``gpu`` (faiss-gpu: ``StandardGpuResources`` +
        ``index_cpu_to_gpu``); searches then run there. A search that needs more than
        :data:`GPU_MAX_K` chunks (FAISS GPU's top-k limit) runs on the CPU copy, so results stay
        exact. Without FAISS GPU support, a Flat index moves to torch (:class:`~longrag.index.torch_search.TorchFlatIndex`,
        no top-k limit). Raises :class:`IndexDeviceError` when no GPU can search this index."""
        if self._cpu_index is not None:
            return
        if not hasattr(faiss, "StandardGpuResources"):  # exact shards search through torch instead
            check_gpu(gpu, exact=torch_search.can_search(self.index))
            self._cpu_index, self.index = self.index, torch_search.TorchFlatIndex.from_faiss(self.index, f"cuda:{gpu}")
            return
        check_gpu(gpu)
        self._gpu_resources = faiss.StandardGpuResources()
        self._cpu_index = self.index
        self.index = faiss.index_cpu_to_gpu(self._gpu_resources, gpu, self.index)

    # ------------------------------------------------------------------ chunks of a unit
    def unit_chunk_scores(self, query: np.ndarray, unit_id: str) -> tuple[list[str], np.ndarray]:
        """Every chunk of ``unit_id`` (ids in position order) with its score for one query (``(dim,)``):
        the inner product (``ip``) or the negated squared distance (``l2``) with the stored vector, as
        the index reconstructs it (exact for Flat, the codes' decoding for PQ/SQ). Raises KeyError for
        a unit this index does not hold, ValueError for an index that cannot reconstruct (IVF
        without a direct map)."""
        if self._unit_pos is None:
            order = np.argsort(self.chunk_units, kind="stable")
            indptr = np.zeros(len(self.unit_ids) + 1, dtype=np.int64)
            np.cumsum(np.bincount(self.chunk_units, minlength=len(self.unit_ids)), out=indptr[1:])
            self._unit_pos = ({str(u): i for i, u in enumerate(self.unit_ids.tolist())}, order, indptr)
        pos, order, indptr = self._unit_pos
        u = pos[unit_id]  # KeyError: not this shard's unit
        ids = order[indptr[u]:indptr[u + 1]]
        chunk_ids = [str(c) for c in self.chunk_ids[ids].tolist()]
        rank = sorted(range(len(ids)), key=lambda i: chunk_ids[i])  # "unit:0003": position order
        ids, chunk_ids = ids[rank], [chunk_ids[i] for i in rank]
        index = self._cpu_index if self._cpu_index is not None else self.index
        try:
            vecs = np.vstack([index.reconstruct(int(i)) for i in ids]) if len(ids) else np.zeros((0, self.dim))
        except RuntimeError as exc:
            raise ValueError(f"a {self.factory!r} index cannot reconstruct its vectors: {exc}") from exc
        q = _check_matrix(np.asarray(query, dtype=np.float32).reshape(1, -1), "query", self.dim)[0]
        scores = vecs @ q if self.metric == "ip" else -((vecs - q) ** 2).sum(axis=1)
        return chunk_ids, scores.astype(np.float64)

    # ------------------------------------------------------------------ search
    def set_search_params(self, params: str | None) -> None:
        """Apply FAISS search-time parameters, e.g. ``"nprobe=32"`` (IVF) or ``"efSearch=128"``
        (HNSW), comma-separated, as :class:`faiss.ParameterSpace` takes them. Empty: no change.
        Raises ValueError for a parameter the index does not have."""
        if not params:
            return
        if not isinstance(params, str):
            raise ValueError(f"search params must be a string like 'nprobe=32', got {type(params).__name__}")
        try:
            for index in (self.index, self._cpu_index):
                if isinstance(index, faiss.Index):  # not a TorchFlatIndex (which has no parameters)
                    space = faiss.GpuParameterSpace() if index is self.index and self.device == "cuda" \
                        else faiss.ParameterSpace()
                    space.set_index_parameters(index, params)
        except RuntimeError as e:
            raise ValueError(f"search params {params!r} do not apply to a {self.factory!r} index: {e}") from e

    def search(self, queries: np.ndarray, k: int) -> list[list[UnitHit]]:
        """Top-``k`` units per query row by MaxP score, best first, each with its best chunk."""
        hits, _ = self.search_with_stats(queries, k)
        return hits

    def search_with_stats(self, queries: np.ndarray, k: int) -> tuple[list[list[UnitHit]], np.ndarray]:
        """Like :meth:`search`, also returning how many chunks each query finally searched (k')."""
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        queries = _check_matrix(queries, "queries", self.dim)
        nq = queries.shape[0]
        k_used = np.zeros(nq, dtype=np.int64)
        results: list[list[UnitHit]] = [[] for _ in range(nq)]
        if nq == 0 or self.ntotal == 0:
            return results, k_used
        k = min(int(k), self.n_units)
        # Start near the chunk count k average units hold (a Flat scan costs the same for any k').
        per_unit = -(-self.ntotal // max(self.n_units, 1))
        k_chunks = min(self.ntotal, max(2 * k, k * per_unit))
        pending = np.arange(nq)
        while len(pending):
            on_gpu = self._cpu_index is None or k_chunks <= GPU_MAX_K or not isinstance(self.index, faiss.Index)
            index = self.index if on_gpu else self._cpu_index
            dist, ids = index.search(queries[pending], k_chunks)
            still: list[int] = []
            for row, q in enumerate(pending):
                hits, done = self._units_from_chunks(dist[row], ids[row], k, k_chunks)
                if done:
                    results[q] = hits
                    k_used[q] = k_chunks
                else:
                    still.append(int(q))
            pending = np.asarray(still, dtype=np.int64)
            k_chunks = min(self.ntotal, 2 * k_chunks)
        return results, k_used

    def _units_from_chunks(
        self, dist: np.ndarray, ids: np.ndarray, k: int, k_chunks: int
    ) -> tuple[list[UnitHit], bool]:
        """Reduce one query's chunk list to units; ``done`` says whether the top-k is certain."""
        valid = ids >= 0
        ids = ids[valid]
        scores = dist[valid].astype(np.float64)
        if self.metric == "l2":
            scores = -scores
        best: dict[int, tuple[float, int]] = {}
        for score, cid in zip(scores.tolist(), ids.tolist()):
            u = int(self.chunk_units[cid])
            prev = best.get(u)
            if prev is None or score > prev[0] or (score == prev[0] and cid < prev[1]):
                best[u] = (score, cid)
        ranked = sorted(best.items(), key=lambda kv: (-kv[1][0], self.unit_ids[kv[0]]))[:k]
        # An approximate index (IVF, HNSW) returns fewer than k' chunks (-1 ids) once its probes are
        # used up; asking for more cannot help, so what it found is the answer.
        exhausted = k_chunks >= self.ntotal or len(ids) < k_chunks
        if not exhausted:
            if len(ranked) < k:
                return [], False
            # Every chunk scoring >= the k-th unit's score must have been returned, otherwise an
            # unseen chunk could tie with it (and win on unit_id) or own the tying best chunk.
            if not ranked[-1][1][0] > float(scores.min()):
                return [], False
        hits = [
            UnitHit(unit_id=str(self.unit_ids[u]), score=float(s), best_chunk_id=str(self.chunk_ids[c]))
            for u, (s, c) in ranked
        ]
        return hits, True

    def units_from_scores(self, scores: np.ndarray, k: int) -> list[UnitHit]:
        """The MaxP rule over another signal's score of every chunk (row order = this index's, e.g.
        :meth:`longrag.index.lexical.LexicalIndex.scores`): the top ``k`` units by their best chunk,
        ties as :meth:`search` breaks them (unit_id; the chunk added first). Chunks scoring 0 or
        less match nothing and find no unit."""
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        scores = np.asarray(scores)
        if scores.shape != (self.ntotal,):
            raise ValueError(f"expected one score per chunk ({self.ntotal}), got shape {scores.shape}")
        hit = np.flatnonzero(scores > 0)
        if not len(hit):
            return []
        # best first, the first-added chunk among equals; then each unit's first row is its best chunk
        hit = hit[np.lexsort((hit, -scores[hit].astype(np.float64)))]
        units, first = np.unique(self.chunk_units[hit], return_index=True)
        best = hit[first]
        ranked = sorted(zip(units.tolist(), best.tolist()),
                        key=lambda uc: (-float(scores[uc[1]]), self.unit_ids[uc[0]]))[:int(k)]
        return [UnitHit(unit_id=str(self.unit_ids[u]), score=float(scores[c]), best_chunk_id=str(self.chunk_ids[c]))
                for u, c in ranked]

    # ------------------------------------------------------------------ persistence
    def to_files(self) -> dict[str, bytes]:
        """Serialize to ``{file name: bytes}`` (FAISS index, npy and parquet maps, JSON meta)."""
        buf = io.BytesIO()
        np.save(buf, self.chunk_units, allow_pickle=False)
        meta = {
            "format": 1,
            "metric": self.metric,
            "factory": self.factory,
            "dim": self.dim,
            "ntotal": self.ntotal,
            "n_units": self.n_units,
        }
        return {
            INDEX_FILE: faiss.serialize_index(self._cpu_index or self.index).tobytes(),
            CHUNK_UNITS_FILE: buf.getvalue(),
            CHUNK_IDS_FILE: _parquet_bytes("chunk_id", self.chunk_ids),
            UNIT_IDS_FILE: _parquet_bytes("unit_id", self.unit_ids),
            META_FILE: json.dumps(meta, indent=2).encode(),
        }

    @classmethod
    def from_files(cls, files: dict[str, bytes], *, index_path: str | Path | None = None) -> MaxPIndex:
        """Inverse of :meth:`to_files`. With ``index_path`` the FAISS index is read from that file
        instead of ``files``, its codes memory-mapped where the index type allows it (FAISS
        ``IO_FLAG_MMAP_IFC``: the flat-code indexes, Flat, SQ, PQ, HNSW's storage; an IVF index is read
        into memory): the file must stay as it is while the index lives (the shard cache's files are
        never rewritten)."""
        missing = [name for name in INDEX_FILES if name not in files and not (name == INDEX_FILE and index_path)]
        if missing:
            raise FileNotFoundError(f"MaxP index files missing: {missing}")
        meta = json.loads(files[META_FILE])
        if index_path is not None:
            index = faiss.read_index(str(index_path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
        else:
            index = faiss.deserialize_index(np.frombuffer(files[INDEX_FILE], dtype=np.uint8))
        chunk_units = np.load(io.BytesIO(files[CHUNK_UNITS_FILE]), allow_pickle=False)
        chunk_ids = _parquet_column(files[CHUNK_IDS_FILE], "chunk_id")
        unit_ids = _parquet_column(files[UNIT_IDS_FILE], "unit_id")
        out = cls(index, chunk_units, unit_ids, chunk_ids, meta["metric"], meta["factory"])
        if out.dim != meta["dim"] or out.n_units != meta["n_units"]:
            raise ValueError(f"index files disagree with {META_FILE}: {meta}")
        return out

    def save(self, directory: str | Path) -> list[str]:
        """Write the index files into ``directory``; returns the file names written."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        files = self.to_files()
        for name, data in files.items():
            (directory / name).write_bytes(data)
        return sorted(files)

    @classmethod
    def load(cls, directory: str | Path) -> MaxPIndex:
        directory = Path(directory)
        missing = [name for name in INDEX_FILES if not (directory / name).is_file()]
        if missing:
            raise FileNotFoundError(f"MaxP index files missing in {directory}: {missing}")
        return cls.from_files({name: (directory / name).read_bytes() for name in INDEX_FILES})


def merge_topk(lists_of_hits: Sequence[Sequence[UnitHit]], k: int) -> list[UnitHit]:
    """Merge per-shard top-k unit lists into the global top-k (score desc, then unit_id asc).

    Exact when every list is its shard's exact top-k and no unit spans shards; a unit that does
    appear twice keeps its best hit.
    """
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    best: dict[str, UnitHit] = {}
    for hits in lists_of_hits:
        for hit in hits:
            prev = best.get(hit.unit_id)
            if prev is None or hit.score > prev.score:
                best[hit.unit_id] = hit
    return sorted(best.values(), key=lambda h: (-h.score, h.unit_id))[:k]


def _parquet_bytes(column: str, values: np.ndarray) -> bytes:
    table = pa.table({column: pa.array([str(v) for v in values], type=pa.string())})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _parquet_column(data: bytes, column: str) -> np.ndarray:
    table = pq.read_table(io.BytesIO(data), columns=[column])
    return np.asarray(table.column(column).to_pylist(), dtype=object)
