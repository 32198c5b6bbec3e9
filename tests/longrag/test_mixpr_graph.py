"""MixPR's parts: chunker rules, TF-IDF vs scikit-learn, graph vs brute force, PageRank vs a direct
sparse solve and networkx, dedup equivalence."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from sklearn.feature_extraction.text import TfidfVectorizer

from longrag.mixpr import (
    MixPRConfig,
    chunk_text,
    embed_tfidf,
    personalized_pagerank,
    similarity_graph,
)
from longrag.mixpr.chunking import split_words_evenly

# ---------------------------------------------------------------- chunking


def test_split_words_evenly():
    assert split_words_evenly(64, 32) == [32, 32]
    assert split_words_evenly(65, 32) == [22, 22, 21]
    assert split_words_evenly(5, 32) == [5]
    assert split_words_evenly(0, 32) == []
    for n in range(1, 200):
        sizes = split_words_evenly(n, 7)
        assert sum(sizes) == n and max(sizes) <= 7 and max(sizes) - min(sizes) <= 1
        assert len(sizes) == -(-n // 7)


def test_chunker_rules_and_offsets():
    long_line = " ".join(f"w{i}" for i in range(70))  # one 70-word line, no period
    text = (
        "Short one. Another short sentence here.\n"
        + "lineA has four words\nlineB has four words too and a few more words " + "x " * 30 + "\n"
        + long_line
    )
    ch = chunk_text(text, max_words=32)
    for t, s, e in zip(ch.texts, ch.starts, ch.ends):
        assert text[s:e] == t
        assert len(t.split()) <= 32
    assert ch.texts[0] == "Short one."
    # the long trailing sentence (3 lines > 32 words) was split on newlines first
    assert "lineA has four words" in ch.texts
    # the 70-word line became 3 near-equal pieces
    tail = [t for t in ch.texts if t.startswith("w") or " w6" in t]
    assert [len(t.split()) for t in tail] == [24, 23, 23]
    assert np.all(np.diff(ch.starts) > 0)


def test_short_sentence_with_newline_is_not_split():
    ch = chunk_text("A short\nsentence. Next.", max_words=32)
    assert ch.texts == ["A short\nsentence.", "Next."]


def test_chunker_empty_and_whitespace():
    assert len(chunk_text("")) == 0
    assert len(chunk_text("  \n\n  ")) == 0


# ---------------------------------------------------------------- TF-IDF

TEXTS = [
    "The cat sat on the mat.",
    "A dog sat on the log.",
    "The cat sat on the mat.",  # duplicate
    "Cats and dogs are pets; the cat likes the mat.",
    "!!!",  # no term
    "Quantum chromodynamics describes quarks and gluons.",
]


@pytest.mark.parametrize("sublinear", [False, True])
def test_tfidf_matches_sklearn(sublinear):
    cfg = MixPRConfig(sublinear_tf=sublinear)
    emb = embed_tfidf(TEXTS, cfg)
    assert emb.matrix.shape[0] == len(TEXTS) - 1  # duplicate merged
    ref = TfidfVectorizer(sublinear_tf=sublinear, dtype=np.float64).fit(TEXTS)
    R = ref.transform(TEXTS).toarray()
    ours = emb.matrix[emb.classes].toarray()
    # same vocabulary order (sorted terms)
    assert list(emb.counter.get_feature_names_out()) == list(ref.get_feature_names_out())
    np.testing.assert_allclose(ours, R, atol=1e-6)
    np.testing.assert_allclose(emb.transform(["cat mat unknownword"]).toarray(), ref.transform(["cat mat unknownword"]).toarray(), atol=1e-6)


def test_tfidf_empty_vocabulary():
    emb = embed_tfidf(["!!", "?"])
    assert emb.matrix.shape == (2, 0)
    assert embed_tfidf([]).matrix.shape == (0, 0)


# ---------------------------------------------------------------- graph


def _random_unit_rows(n, d, density, seed):
    rng = np.random.default_rng(seed)
    # Zipf-like column popularity so some columns are "frequent"
    pop = 1.0 / np.arange(1, d + 1) ** 0.8
    M = sp.random(n, d, density=density, random_state=rng, format="csr", dtype=np.float64)
    M = M.multiply(sp.csr_matrix(pop)).tocsr()
    dense_cols = rng.random((n, 5)) < 0.7  # a few very frequent columns
    M = (M + sp.csr_matrix(np.hstack([dense_cols * rng.random((n, 5)), np.zeros((n, d - 5))]))).tocsr()
    norms = np.sqrt(np.asarray(M.multiply(M).sum(1)).ravel())
    norms[norms == 0] = 1
    M = sp.diags(1 / norms) @ M
    M = M.tocsr()
    M[3] = 0  # an empty row
    M.eliminate_zeros()
    return M.astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("self_loops", [True, False])
def test_graph_methods_equal_brute_force(seed, self_loops):
    E = _random_unit_rows(300, 80, 0.05, seed)
    t = 0.27
    D = (E @ E.T).toarray().astype(np.float64)
    D[D < t] = 0
    if not self_loops:
        np.fill_diagonal(D, 0)
    for method, kw in (("blocked", {"block_rows": 37}), ("pruned", {}), ("pruned", {"n_frequent": 3}),
                       ("pruned", {"n_frequent": 40, "block_rows": 50})):
        S, stats = similarity_graph(E, t, self_loops=self_loops, method=method, **kw)
        assert S.dtype == np.float32 and S.shape == (300, 300)
        np.testing.assert_allclose(S.toarray(), D, atol=1e-6, err_msg=f"{method} {kw}")
        assert (S != S.T).nnz == 0
        assert stats.n_edges == int(np.count_nonzero(np.triu(D, 1)))


def _rare_word_rows(n, seed):
    """Rows sharing few words (each rare column in ~2 rows, as in HashHop) plus 5 frequent columns."""
    rng = np.random.default_rng(seed)
    d_rare = n * 3 // 2
    rows = np.repeat(np.arange(n), 3)
    cols = 5 + rng.integers(0, d_rare, size=rows.size)
    freq = rng.random((n, 5)) < 0.6
    fr, fc = np.nonzero(freq)
    M = sp.csr_matrix((rng.random(rows.size + fr.size) + 0.1, (np.concatenate([rows, fr]), np.concatenate([cols, fc]))),
                      shape=(n, 5 + d_rare))  # fmt: skip
    M.sum_duplicates()
    norms = np.sqrt(np.asarray(M.multiply(M).sum(1)).ravel())
    return (sp.diags(1 / norms) @ M).tocsr().astype(np.float32)


@pytest.mark.parametrize("block_rows", [1, 7, 64, 4096])
def test_block_products_hold_every_pair_once(block_rows):
    # both ways of cutting X X^T into blocks: X[b0:] X[b0:b1]^T (dense-ish products) and X[b0:b1] X^T (rare words)
    from longrag.mixpr.graph import _block_products, _pair_entries

    for X in (_random_unit_rows(120, 30, 0.1, 5), _rare_word_rows(150, 5)[:, 5:].tocsr()):
        D = (X @ X.T).toarray()
        want = {(i, j) for i, j in zip(*np.nonzero(np.triu(D, 1)))}
        got, forms = [], set()
        for P, row0, col0, lower in _block_products(X, block_rows):
            forms.add(lower)
            i, j, k = _pair_entries(P, np.arange(P.nnz), row0, col0, lower)
            assert np.all(i < j)
            np.testing.assert_allclose(P.data[k], D[i, j], atol=1e-6)
            got += list(zip(i.tolist(), j.tolist()))
        assert len(got) == len(set(got)) and set(got) == want
        assert len(forms) == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_pruned_graph_on_rare_words_equals_brute_force(seed):
    E = _rare_word_rows(400, seed)
    t = 0.27
    D = (E @ E.T).toarray().astype(np.float64)
    D[D < t] = 0
    for kw in ({}, {"n_frequent": 5, "block_rows": 50}, {"n_frequent": 2, "block_rows": 7}, {"n_frequent": 0}):
        S, stats = similarity_graph(E, t, **kw)
        np.testing.assert_allclose(S.toarray(), D, atol=1e-6, err_msg=str(kw))
        assert stats.n_edges == int(np.count_nonzero(np.triu(D, 1)))


def test_graph_on_real_text_pruned_equals_blocked():
    from lab.synthetic import generate_babilong

    s = generate_babilong("qa2", 16_000, seed=3)
    E = embed_tfidf(chunk_text(s.document).texts).matrix
    S1, _ = similarity_graph(E, 0.27, method="blocked")
    for nf in (None, 4, 64):
        S2, _ = similarity_graph(E, 0.27, method="pruned", n_frequent=nf)
        assert S1.nnz == S2.nnz
        assert abs(S1 - S2).max() < 1e-6


def test_graph_rejects_bad_input():
    with pytest.raises(ValueError):
        similarity_graph(np.eye(3), 0.27)
    with pytest.raises(ValueError):
        similarity_graph(sp.eye(3, format="csr"), 0.0)
    with pytest.raises(ValueError):
        similarity_graph(sp.eye(3, format="csr"), 0.3, method="dense")


# ---------------------------------------------------------------- PageRank


def _graph_with_dangling(seed=0, n=60):
    E = _random_unit_rows(n, 40, 0.08, seed)
    S, _ = similarity_graph(E, 0.2)
    deg = np.asarray(S.sum(0)).ravel()
    assert (deg == 0).any(), "test graph should have a dangling node (the empty row)"
    return S


def _direct_solve(S, p, alpha, q):
    """Solve (I - (1-alpha)(A + q d^T)) x = alpha p with A = S D^-1, d = dangling indicator."""
    n = S.shape[0]
    deg = np.asarray(S.sum(0)).ravel()
    inv = np.where(deg > 0, 1 / np.where(deg > 0, deg, 1), 0)
    A = S.astype(np.float64) @ sp.diags(inv)
    dang = (deg == 0).astype(float)
    M = sp.eye(n) - (1 - alpha) * (A + sp.csr_matrix(np.outer(q, dang)))
    return spla.spsolve(M.tocsc(), alpha * p)


def _nx_graph(S):
    return nx.from_scipy_sparse_array(S.astype(np.float64), create_using=nx.DiGraph)


def test_ppr_equals_direct_solve_and_networkx():
    S = _graph_with_dangling()
    n = S.shape[0]
    p = np.zeros(n)
    p[[3, n - 1, n - 2]] = [0.2, 0.4, 0.4]  # node 3 is dangling: its mass must return to p
    alpha = 0.6
    ours = personalized_pagerank(S, p, alpha, max_iter=500, tol=1e-13)
    assert ours.converged and ours.n_iter < 500
    np.testing.assert_allclose(ours.scores, _direct_solve(S, p, alpha, p), atol=1e-9)
    ref = nx.pagerank(_nx_graph(S), alpha=1 - alpha, personalization=dict(enumerate(p)), tol=1e-13, max_iter=1000)
    np.testing.assert_allclose(ours.scores, np.array([ref[i] for i in range(n)]), atol=1e-6)
    assert abs(ours.scores.sum() - 1) < 1e-12


def test_plain_pagerank_alpha_zero_matches_networkx_and_closed_form():
    S = _graph_with_dangling(seed=2)
    n = S.shape[0]
    ours = personalized_pagerank(S, None, 0.0, max_iter=5000, tol=1e-14, dangling=np.full(n, 1 / n))
    ref = nx.pagerank(_nx_graph(S), alpha=1.0, tol=1e-14, max_iter=5000)
    np.testing.assert_allclose(ours.scores, np.array([ref[i] for i in range(n)]), atol=1e-6)


def test_plain_pagerank_closed_form_without_dangling():
    # two components, self loops: from the uniform start each component keeps |C|/n, shared by degree
    S = sp.csr_matrix(
        np.array(
            [
                [1.0, 0.5, 0, 0, 0],
                [0.5, 1.0, 0.3, 0, 0],
                [0, 0.3, 1.0, 0, 0],
                [0, 0, 0, 1.0, 0.9],
                [0, 0, 0, 0.9, 1.0],
            ]
        )
    )
    res = personalized_pagerank(S, None, 0.0, max_iter=10_000, tol=1e-15)
    deg = np.asarray(S.sum(0)).ravel()
    expect = np.concatenate([3 / 5 * deg[:3] / deg[:3].sum(), 2 / 5 * deg[3:] / deg[3:].sum()])
    np.testing.assert_allclose(res.scores, expect, atol=1e-9)


def test_iteration_cap_is_honoured():
    S = _graph_with_dangling(seed=4)
    n = S.shape[0]
    p = np.zeros(n)
    p[[3, n - 1]] = 0.5  # node 3 is dangling
    res = personalized_pagerank(S, p, 0.05, max_iter=18, tol=1e-15)
    assert res.n_iter == 18 and not res.converged
    # and equals 18 explicit steps of the update
    deg = np.asarray(S.sum(0)).ravel()
    inv = np.where(deg > 0, 1 / np.where(deg > 0, deg, 1), 0)
    x = np.full(n, 1 / n)
    for _ in range(18):
        x = 0.95 * (S @ (x * inv) + x[deg == 0].sum() * p) + 0.05 * p
    np.testing.assert_allclose(res.scores, x, atol=1e-12)
    assert personalized_pagerank(S, p, 0.6, max_iter=3, tol=None).n_iter == 3


def test_dedup_classes_equal_expanded_graph():
    rng = np.random.default_rng(7)
    E = _random_unit_rows(40, 30, 0.1, 7)
    classes = rng.integers(0, 40, size=150)
    classes[:40] = np.arange(40)  # every row used
    S_small, _ = similarity_graph(E, 0.25)
    S_full, _ = similarity_graph(E[classes], 0.25)
    p = np.zeros(150)
    p[[149, 10]] = [0.7, 0.3]
    for alpha, dang in ((0.6, None), (0.0, np.full(150, 1 / 150)), (0.3, None)):
        a = personalized_pagerank(S_small, p, alpha, max_iter=18, tol=None, classes=classes, dangling=dang)
        b = personalized_pagerank(S_full, p, alpha, max_iter=18, tol=None, dangling=dang)
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-12)
        # nothing merged (every class its own row): the same as no classes
        c = personalized_pagerank(S_full, p, alpha, max_iter=18, tol=None, classes=np.arange(150), dangling=dang)
        np.testing.assert_allclose(c.scores, b.scores, atol=1e-12)


def test_pagerank_input_checks():
    S = sp.eye(3, format="csr")
    with pytest.raises(ValueError):
        personalized_pagerank(S, np.ones(2), 0.5)
    with pytest.raises(ValueError):
        personalized_pagerank(S, np.array([1.0, -1.0, 1.0]), 0.5)
    with pytest.raises(ValueError):
        personalized_pagerank(S, None, 1.5)
    with pytest.raises(ValueError):
        personalized_pagerank(S, None, 0.5, classes=np.array([0, 5]))
