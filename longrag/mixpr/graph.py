"""The chunk similarity graph ``S = E E^T`` with entries below a threshold dropped (Alonso and
Millidge, 2024, "Mixture-of-PageRanks: Replacing Long-Context with Real-Time, Sparse GraphRAG",
Section 4 "Graph Generation" and Appendix A.2). ``S`` is symmetric CSR float32; its column
normalisation (the Markov matrix A) is left to :mod:`longrag.mixpr.pagerank`.

Two exact ways to compute it:

* ``method="blocked"`` -- the definition: ``E`` times one block of rows of ``E^T`` at a time (each pair
  once), thresholded block by block so the dense-ish product never exists at once. Its cost is sum
  over words of df(word)^2: frequent words ("the", "of") make it quadratic in the chunk count.
* ``method="pruned"`` (default) -- the same graph without that quadratic term. Split the words into
  the F most frequent ones (columns ``C``) and the rest (``R``): ``S_ij = R_ij + C_ij`` with
  ``R = E_R E_R^T`` (cheap: rare words) and, by Cauchy-Schwarz, ``C_ij <= c_i c_j`` where ``c`` are
  the row norms on the frequent columns, and more tightly ``C_ij <= sum_g c_gi c_gj`` over groups
  ``g`` of the frequent columns (``c_gi``: row i's norm on group g).

  (a) pairs sharing a rare word (``R_ij > 0``): kept as candidates when ``R_ij + c_i c_j >= t``, then
      when ``R_ij + sum_g c_gi c_gj >= t``; ``C_ij`` is then added exactly (dense dot products of the
      frequent-word parts) and the threshold applied to the exact value;
  (b) pairs sharing only frequent words (``R_ij = 0``, so ``S_ij = C_ij``) need ``c_i c_j >= t``:
      with the rows sorted by ``c`` (largest first) the first of such a pair has ``c >= sqrt(t)``
      ("heavy") and the second ``c >= t / c_first``, so only those products of the frequent-word
      parts are computed (dense blocks, BLAS); the pairs that reach t and were not found in (a) get
      their exact value from the sparse rows (the plain product's sum, in column order).

  Every pair with ``S_ij >= t`` is found in (a) or (b) and its value is exact (float32 rounding
  aside; the bounds carry a relative slack of ``_SLACK`` so rounding never drops a pair), so both
  methods give the same graph; tests check it against the dense product on random and real text.
  The rare-word product is cut into row blocks as :func:`_block_products` says.

The diagonal (a chunk's similarity to itself, 1 for a non-empty row) is kept when ``self_loops``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["similarity_graph", "GraphStats"]

_PAIR_BATCH = 1 << 16  # candidate pairs whose exact value is computed at once
_ENTRY_BATCH = 1 << 20  # entries of a block product bounded at once
_HEAVY_BLOCK = 512  # heavy rows per dense product in (b)
_PARTNER_BLOCK = 8192  # partner rows per dense product in (b)
_SLACK = 1e-5  # relative slack of the pruning bounds (float32 rounding)
_FREQUENT_CHOICES = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass
class GraphStats:
    n_nodes: int
    n_edges: int  # undirected pairs i < j
    n_candidates: int  # pairs whose exact value was computed (pruned method)
    method: str


def _check_embeddings(E: sp.spmatrix) -> sp.csr_matrix:
    if not sp.issparse(E) or E.ndim != 2:
        raise ValueError(f"E must be a 2-D scipy sparse matrix, got {type(E).__name__}")
    E = sp.csr_matrix(E)
    if E.dtype != np.float32:
        E = E.astype(np.float32)
    if E.nnz and not np.all(np.isfinite(E.data)):
        raise ValueError("E has non-finite entries")
    return E


def _block_products(X: sp.csr_matrix, block_rows: int) -> Iterator[tuple[sp.csr_matrix, int, int, bool]]:
    """``X X^T`` in blocks of rows: ``(P, row0, col0, lower)`` where entry ``(r, c)`` of ``P`` is the
    product of rows ``row0 + r`` and ``col0 + c``; over all blocks, the entries with column < row
    (``lower``) or column > row (not ``lower``) hold every pair of different rows once.

    Two ways: ``X[b0:] @ X[b0:b1]^T`` for blocks of ``block_rows`` rows (lower; half the products,
    but every block scans all the rows after it), or ``X[b0:b1] @ X^T`` with ``X^T`` transposed once
    (all the products, a block scans only itself). The second is taken when the product is cheap
    anyway (few words shared, as in HashHop): when half the products, ``sum(df^2) / 2``, cost less
    than the scans, ``blocks * nnz / 2``; its blocks then run while their products stay within
    ``block_rows * n``, the most entries a block of ``block_rows`` rows can have."""
    n = X.shape[0]
    df = np.bincount(X.indices, minlength=X.shape[1]).astype(np.float64)
    n_blocks = -(-n // block_rows)
    if df @ df < n_blocks * X.nnz:
        XT = X.T.tocsr()
        row_products = np.bincount(np.repeat(np.arange(n), np.diff(X.indptr)), weights=df[X.indices], minlength=n)
        ends = np.cumsum(row_products)  # products of the rows up to each row
        b0 = 0
        while b0 < n:
            start = ends[b0 - 1] if b0 else 0.0
            b1 = max(b0 + 1, int(np.searchsorted(ends, start + block_rows * n, side="right")))
            yield X[b0:b1] @ XT, b0, 0, False
            b0 = b1
    else:
        for b0 in range(0, n, block_rows):
            yield X[b0:] @ X[b0 : b0 + block_rows].T.tocsr(), b0, b0, True


def _pair_entries(P: sp.csr_matrix, k: np.ndarray, row0: int, col0: int, lower: bool):
    """``(i, j, k)``, ``i < j``: the rows of the entries ``k`` (positions in ``P.data``) of a block of
    :func:`_block_products`, for the entries that are a pair of different rows counted there."""
    if k.size * 16 < P.nnz:  # a few entries: binary search for their rows; many: one pass over all
        r = np.searchsorted(P.indptr, k, side="right") - 1 + row0
    else:
        r = np.repeat(np.arange(row0, row0 + P.shape[0]), np.diff(P.indptr))[k]
    c = P.indices[k].astype(np.int64) + col0
    keep = c < r if lower else c > r
    r, c, k = r[keep], c[keep], k[keep]
    return (c, r, k) if lower else (r, c, k)


def _upper_pairs(X: sp.csr_matrix, t: float, block_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(i, j, v)``, ``i < j``: the entries of ``X X^T`` with ``v >= t`` (the plain blockwise product)."""
    rows, cols, vals = [], [], []
    for P, row0, col0, lower in _block_products(X, block_rows):
        i, j, k = _pair_entries(P, np.flatnonzero(P.data >= t), row0, col0, lower)
        rows.append(i)
        cols.append(j)
        vals.append(P.data[k])
    return _cat(rows, np.int64), _cat(cols, np.int64), _cat(vals, np.float32)


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
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
        r, c, v = _upper_pairs(E, threshold, block_rows)
        S = _assemble(n, r, c, v, diag)
        return S, GraphStats(n, int(r.size), int(r.size), "blocked")
    if method != "pruned":
        raise ValueError(f"method must be 'pruned' or 'blocked', got {method!r}")
    return _pruned(E, threshold, diag, block_rows, n_frequent)


def _choose_n_frequent(E: sp.csr_matrix, df: np.ndarray, t: float) -> int:
    """Pick the number of frequent words by a cost model measured on Wikipedia text: the rare-word
    product costs ~ sum of df^2 over the rare words, the frequent-only pairs ~ 1.5 * heavy * light
    (rows whose frequent-word norm reaches sqrt(t) and t). Candidates: 0, 8, 16, 32, ..., 512. The
    row norms for every candidate come from one bincount over (row, interval of ranks)."""
    n, d = E.shape
    order = np.argsort(-df, kind="stable")
    df2 = df[order].astype(np.float64) ** 2
    rare_cost = df2.sum() - np.concatenate([[0.0], np.cumsum(df2)])  # rare_cost[f]: words f.. are rare
    choices = np.array([f for f in _FREQUENT_CHOICES if f <= d], dtype=np.int64)
    if choices.size == 0:
        return 0
    nb = choices.size + 1  # intervals [0, f1), [f1, f2), ..., [f_last, d)
    bucket_of_word = np.full(d, nb - 1, dtype=np.int64)
    bucket_of_word[order[: choices[-1]]] = np.searchsorted(choices, np.arange(choices[-1]), side="right")
    row_of = np.repeat(np.arange(n) * nb, np.diff(E.indptr))
    sq = np.bincount(row_of + bucket_of_word[E.indices], weights=E.data.astype(np.float64) ** 2, minlength=n * nb)
    c = np.sqrt(np.cumsum(sq.reshape(n, nb)[:, :-1], axis=1))  # c[:, k]: norm on the words of rank < choices[k]
    heavy = np.count_nonzero(c >= math.sqrt(t), axis=0)
    light = np.count_nonzero(c >= t, axis=0)
    cost = np.concatenate([[rare_cost[0]], rare_cost[choices] + 1.5 * heavy * light])
    k = int(np.argmin(cost))  # the first of equal costs: the smallest f
    return 0 if k == 0 else int(choices[k - 1])


def _row_dots(A: sp.csr_matrix, r: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 (k,): ``A[r[k]] . A[c[k]]`` for each pair, summed over the shared columns in column
    order (as the sparse product ``A A^T`` sums them)."""
    out = np.empty(r.size, dtype=np.float32)
    ones = np.ones(A.shape[1], dtype=np.float32)
    for s in range(0, r.size, _PAIR_BATCH):
        sl = slice(s, s + _PAIR_BATCH)
        out[sl] = A[r[sl]].multiply(A[c[sl]]) @ ones  # a sequential sum per row (sum() may pair them up)
    return out


def _bounded_entries(P: sp.csr_matrix, c_row: np.ndarray, c_col: np.ndarray, t: float) -> np.ndarray:
    """Positions of the entries of ``P`` with ``P_ij + c_row[i] c_col[j] >= t``, taken a slice of
    ``_ENTRY_BATCH`` entries at a time so the temporaries stay small whatever the block's size."""
    ip = P.indptr
    keep = []
    for e0 in range(0, P.nnz, _ENTRY_BATCH):
        e1 = min(P.nnz, e0 + _ENTRY_BATCH)
        r0 = int(np.searchsorted(ip, e0, side="right")) - 1
        r1 = int(np.searchsorted(ip, e1, side="left"))  # rows r0 .. r1 - 1 hold the slice
        bound = np.repeat(c_row[r0:r1], np.diff(np.clip(ip[r0 : r1 + 1], e0, e1)))
        bound *= c_col.take(P.indices[e0:e1].astype(np.intp))  # (numpy gathers faster with intp indices)
        bound += P.data[e0:e1]
        keep.append(np.flatnonzero(bound >= t) + e0)
    return _cat(keep, np.int64)


def _pruned(E: sp.csr_matrix, t: float, diag: np.ndarray | None, block_rows: int, n_frequent: int | None):
    n, d = E.shape
    df = np.bincount(E.indices, minlength=d)
    f = _choose_n_frequent(E, df, t) if n_frequent is None else int(min(max(n_frequent, 0), d))
    if f == 0:  # nothing is frequent: the plain product is already cheap
        r, c, v = _upper_pairs(E, t, block_rows)
        return _assemble(n, r, c, v, diag), GraphStats(n, int(r.size), int(r.size), "pruned")
    t_lo = t * (1 - _SLACK)
    rank = np.empty(d, dtype=np.int64)
    rank[np.argsort(-df, kind="stable")] = np.arange(d)
    word_rank = rank[E.indices]
    is_f = word_rank < f
    row_of = np.repeat(np.arange(n), np.diff(E.indptr))
    # frequent part as a dense (n, f) float32 matrix (columns by rank), rare part as CSR over the
    # original columns (E's entries without the frequent ones: no copy of the structure to sort)
    Cd = np.zeros((n, f), dtype=np.float32)
    Cd[row_of[is_f], word_rank[is_f]] = E.data[is_f]
    rare = ~is_f
    before = np.concatenate([[0], np.cumsum(rare)])  # rare entries before each position
    ER = sp.csr_matrix((E.data[rare], E.indices[rare], before[E.indptr]), shape=(n, d))
    # norms of the frequent part: of each row (c) and of each group of frequent words (grouped bound)
    bounds = np.unique(np.array([0, f // 8, f // 4, f // 2, f], dtype=np.int64))
    g = bounds.size - 1
    grp = np.searchsorted(bounds[1:], word_rank[is_f], side="right")
    sq = E.data[is_f].astype(np.float64) ** 2
    cg2 = np.bincount(row_of[is_f] * g + grp, weights=sq, minlength=n * g).reshape(n, g)
    cn = np.sqrt(cg2.sum(axis=1)).astype(np.float32)
    cg = np.sqrt(cg2).astype(np.float32)

    # (a) pairs that share a rare word
    rr, rc, rv = [], [], []
    n_cand = 0
    for P, row0, col0, lower in _block_products(ER, block_rows):
        k = _bounded_entries(P, cn[row0 : row0 + P.shape[0]], cn[col0:], t_lo)
        i, j, k = _pair_entries(P, k, row0, col0, lower)
        val = P.data[k]
        tight = val + np.einsum("ij,ij->i", cg[i], cg[j]) >= t_lo
        i, j, val = i[tight], j[tight], val[tight]
        n_cand += i.size
        for s in range(0, i.size, _PAIR_BATCH):
            si, sj = i[s : s + _PAIR_BATCH], j[s : s + _PAIR_BATCH]
            exact = val[s : s + _PAIR_BATCH] + np.einsum("ij,ij->i", Cd[si], Cd[sj])
            ok = exact >= t
            rr.append(si[ok])
            rc.append(sj[ok])
            rv.append(exact[ok])
    r_a, c_a, v_a = _cat(rr, np.int64), _cat(rc, np.int64), _cat(rv, np.float32)

    # (b) pairs that may share only frequent words (their exact value: the sparse product of the rows)
    r_b, c_b = _frequent_only_pairs(Cd, cn, t_lo)
    if r_b.size and r_a.size:  # a pair of (b) that also shares a rare word was found (exactly) in (a)
        new = ~np.isin(r_b * n + c_b, r_a * n + c_a)
        r_b, c_b = r_b[new], c_b[new]
    n_cand += r_b.size
    v_b = _row_dots(E, r_b, c_b)
    ok = v_b >= t
    r, c, v = np.concatenate([r_a, r_b[ok]]), np.concatenate([c_a, c_b[ok]]), np.concatenate([v_a, v_b[ok]])
    return _assemble(n, r, c, v, diag), GraphStats(n, int(v.size), int(n_cand), "pruned")


def _frequent_only_pairs(C: np.ndarray, cn: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
    """``(i, j)``, ``i < j``: the pairs with ``C_i . C_j >= t`` (dense rows ``C``, norms ``cn``),
    found among those with ``c_i c_j >= t`` only. With the rows sorted by ``c`` (largest first), the
    first row of such a pair has ``c >= sqrt(t)`` ("heavy") and the second ``c >= t / c_first``:
    blocks of heavy rows are multiplied (BLAS) with the rows that can pair with the block's first."""
    order = np.argsort(-cn, kind="stable")
    cs = cn[order]
    n_heavy = int(np.count_nonzero(cs >= math.sqrt(t) * (1 - _SLACK)))
    rows, cols = [], []
    for h0 in range(0, n_heavy, _HEAVY_BLOCK):
        h1 = min(n_heavy, h0 + _HEAVY_BLOCK)
        m = int(np.count_nonzero(cs >= t / cs[h0] * (1 - _SLACK)))  # partners of the block's first row
        H = C[order[h0:h1]]
        for q0 in range(h0, m, _PARTNER_BLOCK):
            q1 = min(m, q0 + _PARTNER_BLOCK)
            M = H @ C[order[q0:q1]].T  # (h1 - h0, q1 - q0)
            p, q = np.nonzero(M >= t)
            keep = q + q0 > p + h0  # each pair once (p: the sorted position of its first row)
            a, b = order[p[keep] + h0], order[q[keep] + q0]
            rows.append(np.minimum(a, b))
            cols.append(np.maximum(a, b))
    return _cat(rows, np.int64), _cat(cols, np.int64)
