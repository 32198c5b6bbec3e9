"""Personalized PageRank by power iteration on a symmetric similarity graph.

The transition matrix is ``A = S D^-1`` (columns of the similarity matrix ``S`` normalised to
sum to one, ``D = diag(column sums)``). It is never formed: ``A x = S (x / d)``, so the symmetric
``S`` (CSR) is the only matrix kept.

Iteration (``alpha`` = restart probability, the paper's convention; networkx's ``alpha`` is
``1 - alpha``)::

    x <- (1 - alpha) * (A x + (sum of x over dangling columns) * q) + alpha * p

A dangling column (a chunk with no edge at all, e.g. no word in the TF-IDF vocabulary, or no
self loop and no neighbour) would leak probability mass; its mass is sent to ``q`` instead, which
is ``p`` by default (the walker restarts at the query, networkx's default) and the uniform
distribution in global mode. ``x`` starts uniform (as networkx does) and always sums to one.
Stopping: after ``max_iter`` steps, or earlier when the L1 change of ``x`` is below ``tol``.
Unlike networkx, hitting ``max_iter`` is not an error (Appendix A.2), and the tolerance does not
grow with ``n`` (networkx stops at an L1 change below ``n * tol``: on a 100K-chunk graph that is
0.1 and PPR would stop after ~4 steps, before mass has travelled 5-6 hops from the query).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["PageRankResult", "personalized_pagerank", "check_personalization"]


@dataclass
class PageRankResult:
    scores: np.ndarray  # float64 (n,), sums to one
    n_iter: int
    converged: bool
    delta: float  # L1 change of the last step


def check_personalization(p: np.ndarray, n: int, name: str = "p") -> np.ndarray:
    """``p`` as a float64 probability vector of shape (n,) (normalised to sum one)."""
    p = np.asarray(p)
    if p.ndim != 1 or p.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {p.shape}")
    if not np.issubdtype(p.dtype, np.number):
        raise ValueError(f"{name} must be numeric, got dtype {p.dtype}")
    p = p.astype(np.float64)
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"{name} must be finite and non-negative")
    total = p.sum()
    if total <= 0:
        raise ValueError(f"{name} must have positive mass")
    return p / total


def personalized_pagerank(
    S: sp.csr_matrix,
    p: np.ndarray | None,
    alpha: float,
    *,
    max_iter: int = 18,
    tol: float | None = 1e-6,
    dangling: np.ndarray | None = None,
    start: np.ndarray | None = None,
    classes: np.ndarray | None = None,
) -> PageRankResult:
    """Power iteration of ``x = (1-alpha) A x + alpha p`` with ``A = S D^-1``.

    S: symmetric non-negative CSR (n, n). p: restart distribution (n,), None = uniform.
    alpha: restart probability in [0, 1]; 0 is plain PageRank (no restart).
    dangling: where a dangling column's mass goes (n,), None = ``p``.
    start: the initial distribution, None = uniform.
    classes: (n,) int, row of ``S`` of each node, when identical nodes were merged: ``S`` is then
        the graph of the m distinct nodes and the result equals PageRank on the full n-node graph
        (identical nodes have identical rows and columns, so ``A x`` only needs each class's total
        mass: ``(A x)_i = sum_c S[c(i), c] X_c / d_c`` with ``d_c = sum_c' m_c' S[c', c]``).
        None: one node per row.
    """
    if not sp.issparse(S) or S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"S must be a square scipy sparse matrix, got {type(S).__name__} {getattr(S, 'shape', None)}")
    if not (0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha (restart probability) must lie in [0, 1], got {alpha}")
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    if tol is not None and not tol > 0:
        raise ValueError(f"tol must be positive or None, got {tol}")
    S = S.tocsr()
    m_rows = S.shape[0]
    if classes is None:
        n = m_rows
        mult = None
    else:
        classes = np.asarray(classes)
        if classes.ndim != 1 or not np.issubdtype(classes.dtype, np.integer):
            raise ValueError(f"classes must be a 1-D integer array, got {classes.dtype} {classes.shape}")
        if classes.size and (classes.min() < 0 or classes.max() >= m_rows):
            raise ValueError(f"classes must index rows of S (0..{m_rows - 1})")
        n = classes.shape[0]
        mult = np.bincount(classes, minlength=m_rows).astype(np.float64)
    if n == 0:
        return PageRankResult(np.zeros(0), 0, True, 0.0)
    uniform = np.full(n, 1.0 / n)
    p = uniform if p is None else check_personalization(p, n, "p")
    q = p if dangling is None else check_personalization(dangling, n, "dangling")
    x = uniform.copy() if start is None else check_personalization(start, n, "start")

    if S.dtype != np.float64:  # one conversion, not one per matvec
        S = S.astype(np.float64)
    # column sums of the full graph: d_c = sum_c' m_c' S[c', c] (S symmetric)
    deg = np.asarray(S.sum(axis=0)).ravel() if mult is None else S @ mult
    row_dangling = deg <= 0
    inv_deg = np.zeros(m_rows)
    np.divide(1.0, deg, out=inv_deg, where=~row_dangling)
    is_dangling = row_dangling if mult is None else row_dangling[classes]
    if classes is not None and n == m_rows and np.array_equal(classes, np.arange(n)):
        classes = None  # nothing was merged: the class sums below would be the identity
    any_dangling = bool(is_dangling.any())
    damp = 1.0 - alpha
    restart = alpha * p

    delta = float("inf")
    for it in range(1, max_iter + 1):
        if classes is None:
            x_new = S @ (x * inv_deg)
        else:
            x_new = (S @ (np.bincount(classes, weights=x, minlength=m_rows) * inv_deg))[classes]
        if any_dangling:
            x_new += x[is_dangling].sum() * q
        if damp != 1.0:
            x_new *= damp
        if alpha:
            x_new += restart
        delta = float(np.abs(x_new - x).sum())
        x = x_new
        if tol is not None and delta < tol:
            return PageRankResult(x, it, True, delta)
    return PageRankResult(x, max_iter, tol is not None and delta < tol, delta)
