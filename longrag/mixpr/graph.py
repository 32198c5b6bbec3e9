"""The chunk similarity graph ``S = E E^T`` with entries below a threshold dropped (Alonso and
Millidge, 2024, "Mixture-of-PageRanks: Replacing Long-Context with Real-Time, Sparse GraphRAG",
Section 4 "Graph Generation" and Appendix A.2). ``S`` is symmetric CSR float32; its column
normalisation (the Markov matrix A) is left to :mod:`longrag.mixpr.pagerank`.

Two exact ways to compute it:

* ``method="blocked"`` -- the definition: row blocks of ``E`` times ``E^T`` (upper triangle only,
  mirrored), thresholded block by block so the dense-ish product never exists at once. Its cost is
  sum over words of df(word)^2: frequent words ("the", "of") make it quadratic in the chunk count.
* ``method="pruned"`` (default) -- the same graph without that quadratic term. Split the words into
  the F most frequent ones (columns ``C``) and the rest (``R``): ``S_ij = R_ij + C_ij`` with
  ``R = E_R E_R^T`` (cheap: rare words) and ``C_ij <= c_i c_j`` where ``c`` are the row norms on the
  frequent columns (Cauchy-Schwarz).

  (a) pairs sharing a rare word (``R_ij > 0``): kept as candidates when ``R_ij + c_i c_j >= t``,
      then ``C_ij`` is added exactly (dense dot products of the frequent-word parts) and the
      threshold applied to the exact value;
  (b) pairs sharing only frequent words (``R_ij = 0``) need ``c_i c_j >= t``, so one of them has
      ``c >= sqrt(t)`` ("heavy") and the other ``c >= t``: the exact products of those rows are
      computed directly.

  Every pair with ``S_ij >= t`` is found in (a) or (b) and its value is exact (float32 rounding
  aside), so both methods give the same graph; a test checks it on random and real text.

The diagonal (a chunk's similarity to itself, 1 for a non-empty row) is kept when ``self_loops``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["similarity_graph", "GraphStats"]

_PAIR_BATCH = 1 << 16


@dataclass
class GraphStats:
    n_nodes: int
    n_edges: int  # undirected pairs i < j
    n_candidates: int  # pairs whose exact value was computed (pruned method)
    method: str


def _check_embeddings(E: sp.spmatrix) -> sp.csr_matrix:
    if not sp.issparse(E) or E.ndim != 2:
        raise ValueError(f"E must be a 2-D scipy sparse matrix, got {type(E).__name__}")
    E = E.tocsr()
    if E.dtype != np.float32:
        E = E.astype(np.float32)
    if E.nnz and not np.all(np.isfinite(E.data)):
        raise ValueError("E has non-finite entries")
    return E


def _upper_blocks(X: sp.csr_matrix, Y: sp.csr_matrix | None, t: float, block_rows: int):
    """Entries (i, j, v) of ``X Y^T`` (Y = X: only j > i) with ``v >= t``; blockwise."""
    sym = Y is None
    Y = X if sym else Y
    n = X.shape[0]
    rows, cols, vals = [], [], []
    for b0 in range(0, n, block_rows):
        b1 = min(n, b0 + block_rows)
        off = b0 if sym else 0
        P = (X[b0:b1] @ Y[off:].T).tocoo()
        r = P.row.astype(np.int64) + b0
        c = P.col.astype(np.int64) + off
        keep = P.data >= t
        if sym:
            keep &= c > r
        rows.append(r[keep])
        cols.append(c[keep])
        vals.append(P.data[keep].astype(np.float32))
    return _cat(rows, np.int64), _cat(cols, np.int64), _cat(vals, np.float32)


def _cat(parts, dtype):
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def _assemble(n: int, r: np.ndarray, c: np.ndarray, v: np.ndarray, diag: np.ndarray | None) -> sp.csr_matrix:
    """Symmetric CSR from upper-triangle triples (i < j, no duplicates) plus an optional diagonal."""
    rr = [r, c]
    cc = [c, r]
    vv = [v, v]
    if diag is not None:
        nz = np.flatnonzero(diag > 0)
        rr.append(nz)
        cc.append(nz)
        vv.append(diag[nz].astype(np.float32))
    S = sp.csr_matrix((np.concatenate(vv), (np.concatenate(rr), np.concatenate(cc))), shape=(n, n), dtype=np.float32)
    S.sort_indices()
    return S


def _row_sq_norms(E: sp.csr_matrix) -> np.ndarray:
    row_of = np.repeat(np.arange(E.shape[0]), np.diff(E.indptr))
    return np.bincount(row_of, weights=E.data.astype(np.float64) ** 2, minlength=E.shape[0])


def similarity_graph(
    E: sp.spmatrix,
    threshold: float = 0.27,
    *,
    self_loops: bool = True,
    method: str = "pruned",
    block_rows: int = 4096,
    n_frequent: int | None = None,
) -> tuple[sp.csr_matrix, GraphStats]:
    """``(S, stats)``: ``S = E E^T`` with entries ``< threshold`` dropped, symmetric CSR float32.

    E: (n, d) sparse, rows L2-normalised (zero rows allowed). threshold: in (0, 1].
    method: "pruned" (exact, fast) or "blocked" (the plain blockwise product).
    n_frequent: words treated as frequent by "pruned" (None: chosen from the data)."""
    E = _check_embeddings(E)
    if not (0.0 < threshold <= 1.0):
        raise ValueError(f"threshold must be in (0, 1], got {threshold} (0 would keep every pair: a dense graph)")
    if block_rows < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    n = E.shape[0]
    diag = _row_sq_norms(E).astype(np.float32) if self_loops else None
    if method == "blocked":
        r, c, v = _upper_blocks(E, None, threshold, block_rows)
        S = _assemble(n, r, c, v, diag)
        return S, GraphStats(n, int(r.size), int(r.size), "blocked")
    if method != "pruned":
        raise ValueError(f"method must be 'pruned' or 'blocked', got {method!r}")
    return _pruned(E, threshold, diag, block_rows, n_frequent)


def _choose_n_frequent(E: sp.csr_matrix, df: np.ndarray, t: float) -> int:
    """Pick the number of frequent words by a cost model measured on Wikipedia text: the rare-word
    product costs ~ sum of df^2 over the rare words, the heavy-row product ~ 1.5 * heavy * light
    (rows whose frequent-word norm reaches sqrt(t) and t). Candidates: 0, 8, 16, 32, ..., 512."""
    n, d = E.shape
    order = np.argsort(-df, kind="stable")
    df2 = df[order].astype(np.float64) ** 2
    rare_cost = df2.sum() - np.concatenate([[0.0], np.cumsum(df2)])  # rare_cost[f]: words f.. are rare
    rank = np.empty(d, dtype=np.int64)
    rank[order] = np.arange(d)
    word_rank = rank[E.indices]
    row_of = np.repeat(np.arange(n), np.diff(E.indptr))
    sq = E.data.astype(np.float64) ** 2
    best_f, best_cost = 0, rare_cost[0]
    for f in (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512):
        if f > d:
            break
        m = word_rank < f
        c = np.sqrt(np.bincount(row_of[m], weights=sq[m], minlength=n))
        heavy = np.count_nonzero(c >= math.sqrt(t))
        light = np.count_nonzero(c >= t)
        cost = rare_cost[f] + 1.5 * heavy * light
        if cost < best_cost:
            best_f, best_cost = f, cost
    return best_f


def _pruned(E: sp.csr_matrix, t: float, diag: np.ndarray | None, block_rows: int, n_frequent: int | None):
    n, d = E.shape
    df = np.bincount(E.indices, minlength=d)
    f = _choose_n_frequent(E, df, t) if n_frequent is None else int(min(max(n_frequent, 0), d))
    if f == 0:  # nothing is frequent: the plain product is already cheap
        r, c, v = _upper_blocks(E, None, t, block_rows)
        return _assemble(n, r, c, v, diag), GraphStats(n, int(r.size), int(r.size), "pruned")
    freq_cols = np.argsort(-df, kind="stable")[:f]
    new_id = np.full(d, -1, dtype=np.int64)
    new_id[freq_cols] = np.arange(f)
    is_f = new_id[E.indices] >= 0
    row_of = np.repeat(np.arange(n), np.diff(E.indptr))
    # frequent part as a dense (n, f) float32 matrix, rare part as CSR over the original columns
    Cd = np.zeros((n, f), dtype=np.float32)
    Cd[row_of[is_f], new_id[E.indices[is_f]]] = E.data[is_f]
    ER = sp.csr_matrix((E.data[~is_f], (row_of[~is_f], E.indices[~is_f])), shape=(n, d), dtype=np.float32)
    cn = np.sqrt((Cd.astype(np.float64) ** 2).sum(axis=1)).astype(np.float32)

    # (a) pairs that share a rare word
    rr, rc, rv = [], [], []
    n_cand = 0
    for b0 in range(0, n, block_rows):
        b1 = min(n, b0 + block_rows)
        P = (ER[b0:b1] @ ER[b0:].T).tocoo()
        r = P.row.astype(np.int64) + b0
        c = P.col.astype(np.int64) + b0
        keep = (c > r) & (P.data + cn[r] * cn[c] >= t)
        r, c, val = r[keep], c[keep], P.data[keep]
        n_cand += r.size
        for s in range(0, r.size, _PAIR_BATCH):
            rs, cs = r[s : s + _PAIR_BATCH], c[s : s + _PAIR_BATCH]
            exact = val[s : s + _PAIR_BATCH] + np.einsum("ij,ij->i", Cd[rs], Cd[cs])
            ok = exact >= t
            rr.append(rs[ok])
            rc.append(cs[ok])
            rv.append(exact[ok].astype(np.float32))
    # (b) pairs that may share only frequent words: one row heavy (c >= sqrt t), the other c >= t
    heavy = np.flatnonzero(cn >= math.sqrt(t) * (1 - 1e-6))
    light = np.flatnonzero(cn >= t * (1 - 1e-6))
    if heavy.size:
        Eh, El = E[heavy], E[light]
        for b0 in range(0, heavy.size, block_rows):
            P = (Eh[b0 : b0 + block_rows] @ El.T).tocoo()
            r = heavy[P.row.astype(np.int64) + b0]
            c = light[P.col.astype(np.int64)]
            keep = (P.data >= t) & (r != c)
            r, c = r[keep], c[keep]
            n_cand += r.size
            rr.append(np.minimum(r, c))
            rc.append(np.maximum(r, c))
            rv.append(P.data[keep].astype(np.float32))
    r, c, v = _cat(rr, np.int64), _cat(rc, np.int64), _cat(rv, np.float32)
    if heavy.size and r.size:  # (a) and (b) overlap: keep one copy of each pair
        key = r * n + c
        _, first = np.unique(key, return_index=True)
        r, c, v = r[first], c[first], v[first]
    return _assemble(n, r, c, v, diag), GraphStats(n, int(r.size), int(n_cand), "pruned")
