"""Dual-perspective LongRAG: sentence chunking with overlap/tail merge/mapping, rerank, config section."""

from __future__ import annotations

import numpy as np
import pytest

from longrag.config import LongRAGConfig, load_config
from longrag.dual.chunking import (
    SourceParagraph,
    chunk_paragraph,
    chunk_paragraphs,
    sentence_windows,
    split_document,
)
from longrag.dual.rerank import CROSS_ENCODER, DENSE_ONLY, DualRetriever, RetrievedChunk, dense_top, rerank


def _sentences(n: int, words: int) -> str:
    """n sentences of ``words`` words each: 'S0w1 S0w2 ... S0wN.'"""
    return " ".join(" ".join(f"S{i}w{j}" for j in range(words)) + "." for i in range(n))


# ------------------------------------------------------------------------------------------ chunking


def test_windows_respect_budget_and_overlap_one_sentence():
    # 10 sentences of 10 words, budget 30: windows of 3 sentences, each starting at the previous last
    w = sentence_windows([10] * 10, max_words=30, overlap_sentences=1, min_tail_words=1)
    assert w == [(0, 3), (2, 5), (4, 7), (6, 9), (8, 10)]
    for (_a0, b0), (a1, _) in zip(w, w[1:]):
        assert a1 == b0 - 1  # exactly one sentence repeated


def test_windows_without_overlap_tile_the_sentences():
    assert sentence_windows([10] * 6, 20, overlap_sentences=0, min_tail_words=1) == [(0, 2), (2, 4), (4, 6)]


def test_short_tail_is_merged_into_previous_chunk():
    # budget 30: (0,3) (2,5) then the tail (4,6) brings only sentence 5 = 3 new words < 10
    words = [10, 10, 10, 10, 10, 3]
    assert sentence_windows(words, 30, 1, min_tail_words=10) == [(0, 3), (2, 6)]
    # with a small threshold the tail stays a chunk of its own
    assert sentence_windows(words, 30, 1, min_tail_words=3) == [(0, 3), (2, 5), (4, 6)]


def test_long_sentence_is_its_own_chunk_and_progress_is_made():
    assert sentence_windows([5, 50, 5], 20, 1, min_tail_words=1) == [(0, 1), (1, 2), (2, 3)]
    assert sentence_windows([], 20) == []


def test_bad_chunking_arguments_name_the_value():
    with pytest.raises(ValueError, match="max_words must be a positive int, got 0"):
        sentence_windows([1], 0)
    with pytest.raises(ValueError, match="overlap_sentences"):
        sentence_windows([1], 5, -1)


def test_chunk_text_maps_back_to_paragraph_span():
    p = SourceParagraph("docA/3", _sentences(7, 12), title="A")
    chunks = chunk_paragraph(p, max_words=40, overlap_sentences=1, min_tail_words=5, first_chunk_id=10)
    assert [c.chunk_id for c in chunks] == list(range(10, 10 + len(chunks)))
    assert len(chunks) > 2
    for c in chunks:
        assert c.paragraph_id == "docA/3"
        assert p.text[c.char_start : c.char_end] == c.text
        assert c.text.startswith(f"S{c.sentence_start}w0") and c.text.endswith(f"S{c.sentence_end - 1}w11.")
        assert c.n_words == len(c.text.split()) <= 40
    # neighbouring chunks share exactly their boundary sentence
    for a, b in zip(chunks, chunks[1:]):
        assert b.sentence_start == a.sentence_end - 1


def test_chunk_paragraphs_ids_unique_and_duplicates_rejected():
    ps = [SourceParagraph(f"d/{i}", _sentences(5, 10)) for i in range(3)]
    chunks = chunk_paragraphs(ps, max_words=25, min_tail_words=1)
    assert [c.chunk_id for c in chunks] == list(range(len(chunks)))
    assert {c.paragraph_id for c in chunks} == {"d/0", "d/1", "d/2"}
    with pytest.raises(ValueError, match="duplicate paragraph id 'd/0'"):
        chunk_paragraphs([ps[0], ps[0]])


def test_split_document_at_blank_lines():
    ps = split_document("First para. Two.\n\n  \nSecond para.\nsame para\n\nThird.", doc_id="book")
    assert [p.id for p in ps] == ["book/0", "book/1", "book/2"]
    assert ps[1].text == "Second para.\nsame para"
    with pytest.raises(ValueError, match="non-empty"):
        split_document("   ")


# ------------------------------------------------------------------------------------------ rerank


class _BagEncoder:
    """Deterministic bag-of-words vectors (hashing), L2-normalised: enough to rank by word overlap."""

    def _enc(self, texts):
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace(".", " ").replace("?", " ").split():
                out[i, sum(map(ord, w)) % 64] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    encode_passages = encode_queries = _enc


class _LengthScorer:
    """A fake cross-encoder preferring longer texts (the opposite of nothing in particular)."""

    name = "fake-length"

    def score(self, query, texts):
        return [float(len(t)) for t in texts]


def _paras():
    return [
        SourceParagraph("p/0", "Paris is the capital of France. It lies on the Seine."),
        SourceParagraph("p/1", "Berlin is the capital of Germany."),
        SourceParagraph("p/2", "Bananas are yellow fruit grown in warm places and eaten by many people everywhere."),
    ]


def test_dense_only_is_said_in_the_trace():
    chunks = chunk_paragraphs(_paras(), max_words=200)
    r = DualRetriever(chunks, _BagEncoder(), None, dense_candidates=3, k=2).retrieve("capital of Germany?")
    assert r.trace.mode == DENSE_ONLY == "dense only"
    assert r.trace.reranker is None and any("dense" in n for n in r.trace.notes)
    assert r.chunks[0].chunk.paragraph_id == "p/1"
    assert len(r.chunks) == 2 and all(c.rerank_score is None for c in r.chunks)


def test_cross_encoder_reorders_dense_candidates():
    chunks = chunk_paragraphs(_paras(), max_words=200)
    r = DualRetriever(chunks, _BagEncoder(), _LengthScorer(), dense_candidates=3, k=1).retrieve("capital of Germany?")
    assert r.trace.mode == CROSS_ENCODER and r.trace.reranker == "fake-length"
    assert r.chunks[0].chunk.paragraph_id == "p/2"  # the longest text wins the fake rerank
    assert r.trace.candidates == 3 and r.trace.k == 1


def test_rerank_only_sees_the_dense_candidates():
    chunks = chunk_paragraphs(_paras(), max_words=200)
    r = DualRetriever(chunks, _BagEncoder(), _LengthScorer(), dense_candidates=1, k=1).retrieve("capital of Germany?")
    assert r.chunks[0].chunk.paragraph_id == "p/1"


def test_rerank_checks_k_and_scorer_length():
    c = [RetrievedChunk(chunk_paragraphs(_paras())[0], 1.0)]
    with pytest.raises(ValueError, match="k must be a positive int, got 0"):
        rerank("q", c, 0, None)

    class Bad:
        name = "bad"

        def score(self, q, t):
            return []

    with pytest.raises(RuntimeError, match="returned 0 scores for 1 chunks"):
        rerank("q", c, 1, Bad())


def test_dense_top_orders_best_first_with_stable_ties():
    assert dense_top(np.array([0.1, 0.9, 0.5, 0.9]), 3).tolist() == [1, 3, 2]
    assert dense_top(np.array([0.1]), 5).tolist() == [0]


def test_missing_reranker_folder_is_a_clear_error(tmp_path):
    from longrag.dual.rerank import CrossEncoderScorer

    with pytest.raises(FileNotFoundError, match="dual.reranker=null"):
        CrossEncoderScorer(tmp_path / "nope")


# ------------------------------------------------------------------------------------------ config


def test_dual_config_defaults_and_overrides():
    cfg = LongRAGConfig()
    assert (cfg.dual.chunk_words, cfg.dual.rerank_k, cfg.dual.dense_candidates) == (200, 7, 100)
    assert cfg.dual.reranker is None and cfg.dual.strategy == "E&F" and cfg.dual.overlap_sentences == 1
    cfg = load_config(None, ["dual.chunk_words=500", "dual.rerank_k=3", "dual.strategy=R&L"])
    assert (cfg.dual.chunk_words, cfg.dual.rerank_k, cfg.dual.strategy) == (500, 3, "R&L")
    with pytest.raises(ValueError, match="strategy"):
        load_config(None, ["dual.strategy=bogus"])


def test_trace_names_the_scorer_kind_and_a_call_can_override_the_scorer():
    class _Bi(_LengthScorer):
        kind = "bi-encoder"
        name = "fake-bi"

    chunks = chunk_paragraphs(_paras(), max_words=200)
    retriever = DualRetriever(chunks, _BagEncoder(), _Bi(), dense_candidates=3, k=1)
    r = retriever.retrieve("capital of Germany?")
    assert r.trace.mode == "bi-encoder" and r.trace.reranker == "fake-bi"
    assert r.chunks[0].chunk.paragraph_id == "p/2"  # the longest text
    dense = retriever.retrieve("capital of Germany?", scorer=None)
    assert dense.trace.mode == DENSE_ONLY and dense.chunks[0].chunk.paragraph_id == "p/1"
    assert DualRetriever(chunks, _BagEncoder(), None, k=1).retrieve("x y", scorer=_LengthScorer()).trace.mode == CROSS_ENCODER


def test_load_reranker_refuses_a_folder_without_a_model(tmp_path):
    from longrag.dual.rerank import load_reranker

    (tmp_path / "modules.json").write_text("[]")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_reranker(tmp_path)
