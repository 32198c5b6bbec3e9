"""Links for corpora without hyperlinks, part by part (longrag.index.links), against references:
scikit-learn's TfidfTransformer on the whole matrix, brute-force top-m over all pairs, and the
evaluation's in-memory title-mention links."""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy import sparse

from longrag.index.links import HashedTfidf, edges_from_neighbours, topm_neighbours
from longrag.index.titles import TitleMatcher, mention_positions, title_mention_links, title_positions
from longrag.types import Document

WORDS = ("river castle bridge novel poet orchestra symphony league season goal election senate "
         "island volcano glacier harbor railway tunnel temple dynasty emperor comet planet orbit").split()


def corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25))) for _ in range(n)]
    texts[3] = texts[1]  # an exact duplicate: ties in similarity
    texts[5] = "the of and"  # stop words only: an empty row
    return texts


def parts_of(n: int, sizes: list[int]) -> list[np.ndarray]:
    bounds = np.cumsum([0, *sizes])
    assert bounds[-1] == n
    return [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def reference_topm(x: sparse.csr_matrix, pos: np.ndarray, top_m: int, threshold: float) -> list[list[int]]:
    """All pairs at once: self and position -1 excluded, best first, ties by position."""
    sims = np.asarray((x @ x.T).todense(), dtype=np.float64)
    out = []
    for i in range(x.shape[0]):
        if pos[i] < 0:
            out.append([])
            continue
        cand = [(-sims[i, j], pos[j]) for j in range(x.shape[0])
                if pos[j] >= 0 and pos[j] != pos[i] and sims[i, j] > 0]
        best = sorted(cand)[:top_m]
        out.append([int(p) for s, p in best if -s >= threshold - 1e-9])
    return out


def test_hashed_tfidf_over_parts_equals_sklearn_on_the_whole_corpus():
    from sklearn.feature_extraction.text import TfidfTransformer

    texts = corpus(40, seed=1)
    tf = HashedTfidf(n_features=1 << 12)
    whole = tf.counts(texts)
    expected = TfidfTransformer(sublinear_tf=True, smooth_idf=True, norm="l2").fit_transform(whole)
    total = np.zeros(tf.n_features, dtype=np.int64)
    for part in parts_of(40, [7, 20, 13]):
        terms, df = tf.doc_freq(tf.counts([texts[i] for i in part]))
        np.add.at(total, terms, df)
    idf = tf.idf(total, len(texts))
    got = sparse.vstack([tf.weigh(tf.counts([texts[i] for i in part]), idf) for part in parts_of(40, [7, 20, 13])])
    assert np.allclose(got.toarray(), expected.toarray(), atol=1e-12)
    assert got[5].nnz == 0  # stop words only


def test_doc_freq_leaves_out_rows_that_do_not_count():
    tf = HashedTfidf(n_features=64)
    counts = tf.counts(["river river castle", "castle", "river"])
    terms, df = tf.doc_freq(counts, keep=np.array([True, False, True]))
    river = tf.counts(["river"]).indices[0]
    castle = tf.counts(["castle"]).indices[0]
    assert dict(zip(terms.tolist(), df.tolist())) == {river: 2, castle: 1}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("top_m,threshold", [(1, 1e-6), (3, 0.2), (5, 0.05), (50, 0.1)])
def test_blocked_topm_equals_all_pairs(seed, top_m, threshold):
    rng = np.random.default_rng(seed)
    texts = corpus(45, seed=seed)
    tf = HashedTfidf(n_features=1 << 10)
    counts = tf.counts(texts)
    terms, df = tf.doc_freq(counts)
    total = np.zeros(tf.n_features, dtype=np.int64)
    np.add.at(total, terms, df)
    x = tf.weigh(counts, tf.idf(total, len(texts)))
    pos = rng.permutation(45).astype(np.int64)  # corpus positions are not row order
    pos[rng.choice(45, size=3, replace=False)] = -1  # dropped duplicates
    parts = parts_of(45, [10, 1, 16, 18])
    expected = reference_topm(x, pos, top_m, threshold)
    got: list[list[int]] = []
    for rows in parts:
        blocks = [(x[cols], pos[cols]) for cols in parts]
        got.extend(n.tolist() for n in topm_neighbours(x[rows], pos[rows], blocks, top_m=top_m, threshold=threshold))
    assert got == expected


def test_topm_rejects_a_bad_m_or_threshold():
    with pytest.raises(ValueError, match="top_m must be >= 1"):
        topm_neighbours(sparse.csr_matrix((1, 4)), np.array([0]), [], top_m=0, threshold=0.1)
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\]"):
        topm_neighbours(sparse.csr_matrix((1, 4)), np.array([0]), [], top_m=1, threshold=0.0)


def test_edges_from_neighbours():
    src, dst = edges_from_neighbours(np.array([7, 8, 9]), [np.array([1, 2]), np.zeros(0, np.int64), np.array([3])])
    assert src.tolist() == [7, 7, 9] and dst.tolist() == [1, 2, 3]


def test_mention_positions_equal_the_in_memory_title_mention_links():
    titles = ["Lothair II", "Bertha", "Poison (band)", "Paris", "Paris (band)", "Coney Island Baby (film)", "Bertha"]
    texts = ["Lothair II married Bertha.", "Bertha, daughter of Lothair II, lived in Paris.",
             "rat poison is not the band Poison.", "Paris is a city; the band Paris (band) is not.",
             "Coney Island Baby is a film; Poison played.", "Nothing here.", "Bertha again, Bertha."]
    docs = [Document(doc_id=str(i), title=t, text=x) for i, (t, x) in enumerate(zip(titles, texts))]
    expected = title_mention_links(docs)
    matcher, positions = TitleMatcher(titles), title_positions(titles)
    for d, e in zip(docs, expected):
        got = mention_positions(matcher, positions, d.title, d.text)
        assert got == [positions[t] for t in e.links], (d.title, got, e.links)
    assert mention_positions(matcher, positions, "Bertha", "Bertha met Lothair II") == [0]  # not itself
