"""Documents of a unit best first (longrag.index.evidence), checked against a reference that never
looks inside a unit: each document chunked and scored on its own."""

from __future__ import annotations

import random

import numpy as np
import pytest

from longrag.index.chunking import chunk_text, chunk_units
from longrag.index.evidence import chunk_documents, document_scores, order_by_evidence, reorder_documents
from longrag.index.grouping import document_text
from longrag.index.maxp import MaxPIndex
from longrag.index.units import make_units
from longrag.text.tokens import WhitespaceCounter
from longrag.types import Document

COUNTER = WhitespaceCounter(1.0)
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def _docs(rng: random.Random, n: int) -> list[Document]:
    docs = []
    for i in range(n):
        sentences = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))).capitalize() + "." for _ in range(rng.randint(1, 9))]
        docs.append(Document(doc_id=f"d{i}", title=f"Title {i}", text=" ".join(sentences),
                             links=[f"Title {i + 1}"] if i + 1 < n else []))
    return docs


@pytest.mark.parametrize("seed", range(6))
def test_order_matches_documents_scored_alone(seed):
    rng = random.Random(seed)
    docs = _docs(rng, rng.randint(2, 6))
    (unit,) = make_units(docs, kind="grouped", counter=COUNTER, budget=10_000)
    assert unit.doc_ids == [d.doc_id for d in docs]
    chunks = chunk_units([unit], 16, COUNTER)
    score_of = {c: rng.random() for c in {c.text for c in chunks}}  # a chunk's score depends on its text only
    # The reference: each document's own chunks (the same chunker on the document alone), best score each.
    ref = {d.doc_id: max(score_of[t] for t in chunk_text(document_text(d), 16, COUNTER)) for d in docs}
    got, scores = order_by_evidence(unit, [c.text for c in chunks], [score_of[c.text] for c in chunks])
    want = sorted(ref, key=lambda d: (-ref[d], d))
    assert got.doc_ids == want
    assert scores == [ref[d] for d in want]
    by_id = {d.doc_id: d for d in docs}
    assert got.titles == [by_id[d].title for d in want]
    assert got.text == "\n\n".join(document_text(by_id[d]) for d in want)
    assert got.n_tokens == unit.n_tokens and got.unit_id == unit.unit_id


def test_chunk_documents_and_scores_by_hand():
    docs = [Document("a", "A", "one two three. four five six.", ["B"]), Document("b", "B", "seven eight.")]
    (unit,) = make_units(docs, kind="grouped", counter=COUNTER, budget=1000)
    texts = ["A\none two three.", "four five six.", "B\nseven eight."]
    assert chunk_documents(unit, texts) == [0, 0, 1]
    assert document_scores(2, [0, 0, 1], [0.1, 0.7, 0.5]) == [0.7, 0.5]
    assert document_scores(3, [0, 2], [0.2, 0.3]) == [0.2, None, 0.3]
    with pytest.raises(ValueError, match="not in the unit's text"):
        chunk_documents(unit, ["nowhere"])
    with pytest.raises(ValueError, match="permutation"):
        reorder_documents(unit, [0, 0])
    # A document without a chunk keeps its place after the scored ones.
    got, scores = order_by_evidence(unit, ["B\nseven eight."], [0.9])
    assert got.doc_ids == ["b", "a"] and scores == [0.9, None]


def test_single_document_unit_is_unchanged():
    (unit,) = make_units([Document("a", "A", "x y z.")], kind="document", counter=COUNTER)
    got, scores = order_by_evidence(unit, ["A\nx y z."], [0.3])
    assert got == unit and scores == [0.3]


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_unit_chunk_scores_equal_a_plain_product(metric):
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((40, 8)).astype(np.float32)
    unit_of = [f"u{i % 7}" for i in range(40)]  # a unit's chunks are not contiguous in the index
    chunk_ids = [f"u{i % 7}:{i // 7:04d}" for i in range(40)]
    index = MaxPIndex.build(vecs, chunk_ids, unit_of, metric=metric)
    q = rng.standard_normal(8).astype(np.float32)
    for u in sorted(set(unit_of)):
        ids, scores = index.unit_chunk_scores(q, u)
        rows = [i for i in range(40) if unit_of[i] == u]
        assert ids == [chunk_ids[i] for i in rows]  # position order
        want = vecs[rows] @ q if metric == "ip" else -((vecs[rows] - q) ** 2).sum(1)
        np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(KeyError):
        index.unit_chunk_scores(q, "nope")
