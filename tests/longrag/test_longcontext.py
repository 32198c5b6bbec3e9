"""Long-context pipeline (longrag.reading.longcontext): retrieval + routing + window-fitted reading with a
scripted LLM, checked against the retrievers run directly; the MixPR compressor; the fast
chunker / TF-IDF counter against their references (plain chunker, scikit-learn); and one run of
router + reader with the real bundled SmolLM2 on a small HashHop document."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

from lab.synthetic import generate_babilong, generate_hashhop
from longrag.mixpr import MixPRConfig, MixPRRetriever, SparseRetriever, chunk_text, embed_tfidf
from longrag.mixpr import tfidf as tfidf_module
from longrag.mixpr.chunking import chunk_text_reference, whitespace_mask
from longrag.mixpr.tfidf import count_terms
from longrag.reading.longcontext import (
    LongContextPipeline,
    compress_units_with_mixpr,
    reader_messages,
    select_within_budget,
)
from tests.fakes import ScriptedLLM

DOC = (
    "Alice keeps the key in the blue box. The blue box is in the kitchen. "
    "Bob likes football and plays on Sundays. The weather was cold in March. "
    "Carol painted the fence green. The fence borders the garden of the old house. "
    "Dave bought a new bicycle yesterday. The bicycle is red."
)
QUESTION = "Where is the key kept?"


def run(coro):
    return asyncio.run(coro)


# ---------------------------------------------------------------- pipeline (scripted LLM)


def test_mixpr_auto_route_local_reads_chunks_in_document_order():
    llm = ScriptedLLM(["n", "In the blue box."], context_window=4096)
    cfg = MixPRConfig(top_k=3)
    res = run(LongContextPipeline(cfg, llm=llm).run(DOC, QUESTION, retriever="mixpr", route="auto"))
    ref = MixPRRetriever(cfg).retrieve(DOC, QUESTION, route="local")
    assert res.route == "local" and res.answer == "In the blue box"  # cleaned: the trailing period goes
    assert res.trace["raw_answer"] == "In the blue box."
    assert [c["position"] for c in res.chunks] == [c.position for c in ref]
    assert [c["text"] for c in res.chunks] == [c.text for c in ref]
    np.testing.assert_allclose([c["score"] for c in res.chunks], [c.score for c in ref])
    assert [c["position"] for c in res.chunks] == sorted(c["position"] for c in res.chunks)
    # the router saw the question; the reader got the retrieved chunks, in document order
    assert QUESTION in llm.calls[0]["messages"][0]["content"]
    user = llm.calls[1]["messages"][-1]["content"]
    offsets = [user.index(c["text"]) for c in res.chunks]
    assert offsets == sorted(offsets) and QUESTION in user
    t = res.trace
    assert t["routed_by"] == "llm" and t["chunks_read"] == 3 and t["chunks_dropped"] == 0
    assert t["n_chunks"] == len(chunk_text(DOC)) and t["prompt_tokens"] > 0 and t["completion_tokens"] == 4
    for key in ("chunk_ms", "embed_ms", "route_ms", "graph_ms", "pagerank_ms", "topk_ms", "read_ms", "total_ms"):
        assert key in t, key
    d = res.to_dict()
    assert set(d) == {"answer", "route", "chunks", "trace"} and set(d["chunks"][0]) == {"position", "text", "score"}


def test_router_yes_gives_global_pagerank():
    llm = ScriptedLLM(["y", "A summary."])
    cfg = MixPRConfig(top_k=4)
    res = run(LongContextPipeline(cfg, llm=llm).run(DOC, "Summarize the document.", route="auto"))
    assert res.route == "global"
    ref = MixPRRetriever(cfg).retrieve(DOC, "Summarize the document.", route="global")
    assert [c["position"] for c in res.chunks] == [c.position for c in ref]
    assert res.trace["alpha"] == 0.0


def test_explicit_route_skips_router_and_unparsable_router_reply_uses_fallback():
    llm = ScriptedLLM(["An answer."])
    res = run(LongContextPipeline(MixPRConfig(top_k=2), llm=llm).run(DOC, QUESTION, route="global"))
    assert res.route == "global" and len(llm.calls) == 1 and res.trace["routed_by"] == "request"
    llm = ScriptedLLM(["maybe", "x"])
    res = run(LongContextPipeline(MixPRConfig(top_k=2, router_fallback="global"), llm=llm).run(DOC, QUESTION))
    assert res.route == "global"


def test_window_fitting_drops_lowest_scores_first_and_keeps_order():
    llm = ScriptedLLM(["n", "ok"], context_window=100)  # tokens = whitespace words
    cfg = MixPRConfig(top_k=8, answer_max_tokens=10, reader_reserve_tokens=16)
    pipe = LongContextPipeline(cfg, llm=llm)
    res = run(pipe.run(DOC, QUESTION))
    budget = pipe.context_budget(QUESTION, True, cfg)
    scores = np.array([c["score"] for c in res.chunks])
    costs = np.array([len(c["text"].split()) for c in res.chunks])
    kept = select_within_budget(scores, costs, budget)
    assert res.trace["chunks_read"] == kept.size < len(res.chunks)
    assert res.trace["context_tokens"] == costs[kept].sum() <= budget
    user = llm.calls[1]["messages"][-1]["content"]
    kept_texts = [res.chunks[i]["text"] for i in kept]
    assert all(t in user for t in kept_texts)
    assert [user.index(t) for t in kept_texts] == sorted(user.index(t) for t in kept_texts)
    dropped = [res.chunks[i] for i in range(len(res.chunks)) if i not in set(kept.tolist())]
    assert max(c["score"] for c in dropped) <= max(scores[kept])
    # the prompt really fit: the scripted model raises ContextOverflowError otherwise
    assert llm.calls[1]["max_tokens"] == 10


def test_select_within_budget_hand_cases():
    s = np.array([0.1, 0.9, 0.5, 0.7])
    c = np.array([5, 6, 3, 5])
    assert select_within_budget(s, c, 11).tolist() == [1, 3]  # 6 + 5
    assert select_within_budget(s, c, 10).tolist() == [1, 2]  # 6, skip 5, then 3
    assert select_within_budget(s, c, 10, sep_cost=1).tolist() == [1, 2]  # 6 + 1 + 3
    assert select_within_budget(s, c, 2).tolist() == []
    assert select_within_budget(np.zeros(0), np.zeros(0, np.int64), 5).tolist() == []
    with pytest.raises(ValueError):
        select_within_budget(s, c.astype(float), 5)


def test_baselines_and_retrieve_only_without_llm():
    cfg = MixPRConfig(top_k=3)
    res = run(LongContextPipeline(cfg).run(DOC, QUESTION, retriever="sparse", route="local", read=False))
    ref = SparseRetriever(cfg).retrieve(DOC, QUESTION)
    assert res.route is None and res.answer is None and "answer" not in res.to_dict()
    assert [c["position"] for c in res.chunks] == [c.position for c in ref]
    assert res.trace["route_ignored"] == "local"
    res = run(LongContextPipeline(cfg).run(DOC, QUESTION, route="local", read=False, k=2))
    assert len(res.chunks) == 2 and res.trace["k"] == 2
    # no question: the document's last chunk is the query and is a candidate like the others
    res = run(LongContextPipeline(cfg).run(DOC, None, route="local", read=False))
    assert [c["position"] for c in res.chunks] == [c.position for c in MixPRRetriever(cfg).retrieve(DOC)]


def test_hybrid_uses_the_encoder():
    class BagEncoder:  # deterministic dense vectors: hashed bag of words, L2-normalised
        def _enc(self, texts):
            X = np.zeros((len(texts), 16), np.float32)
            for i, t in enumerate(texts):
                for w in t.lower().split():
                    X[i, sum(map(ord, w)) % 16] += 1
            return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-9)

        encode_passages = encode_queries = _enc

    from longrag.mixpr.baselines import HybridRetriever

    cfg = MixPRConfig(top_k=3)
    res = run(LongContextPipeline(cfg, encoder=BagEncoder()).run(DOC, QUESTION, retriever="hybrid", read=False, route="local"))
    ref = HybridRetriever(BagEncoder(), cfg).retrieve(DOC, QUESTION)
    assert [c["position"] for c in res.chunks] == [c.position for c in ref] and res.route is None


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(document="   \n"), "document is empty"),
        (dict(document=b"bytes"), "document must be str"),
        (dict(retriever="dense"), "retriever must be"),
        (dict(route="sideways"), "route must be"),
        (dict(k=0), "k must be"),
        (dict(retriever="hybrid"), "needs a dense encoder"),
        (dict(route="auto", read=False), "needs an LLM"),
        (dict(route="local", read=True), "needs an LLM"),
    ],
)
def test_input_errors(kwargs, msg):
    args = dict(document=DOC, question=QUESTION, retriever="mixpr", route="local", read=False)
    args.update(kwargs)
    doc = args.pop("document")
    q = args.pop("question")
    with pytest.raises(ValueError, match=msg):
        run(LongContextPipeline(MixPRConfig()).run(doc, q, **args))


def test_reader_messages_without_question():
    m = reader_messages("List the colours.", ["a", "b"], has_question=False)
    assert m[0]["role"] == "system" and "REQUEST: List the colours." in m[1]["content"] and "a\nb" in m[1]["content"]


# ---------------------------------------------------------------- MixPR as a context compressor


def test_compress_units_keeps_the_chain_within_budget_in_document_order():
    s = generate_hashhop(3000, 3, seed=4)
    lines = s.document.split("\n")
    units = ["\n".join(lines[i : i + 40]) for i in range(0, len(lines), 40)]
    count = lambda t: len(t.split())  # noqa: E731
    out = compress_units_with_mixpr(s.question, units, 60, count, MixPRConfig())
    assert count(out) <= 60
    for needle in s.needle_texts():
        assert needle in out, needle
    kept = [ln for ln in out.split("\n") if ln]
    joined = "\n\n".join(units)
    pos = [joined.index(ln) for ln in kept]
    assert pos == sorted(pos)
    # fits already: returned unchanged
    assert compress_units_with_mixpr("q?", ["a b", "c d"], 10, count) == "a b\n\nc d"
    with pytest.raises(ValueError):
        compress_units_with_mixpr("", units, 10, count)
    with pytest.raises(ValueError):
        compress_units_with_mixpr("q", units, 0, count)


# ---------------------------------------------------------------- fast chunker / TF-IDF vs references

_ATOMS = ["word", "Dr.", "U.S.", "x", ".", "!", "?", " ", "  ", "\n", "\n\n", " \n \n ", "\t", "\u00a0", "\r",
          "\x0b", "\u2028", "\u2026", '"', "'", ")", "Hello.", "e.g.", "İ", "ΣΑΣ", "\u3000", "A.", '."', "w\nw"]  # fmt: skip


def test_fast_chunker_equals_reference_on_random_and_real_text():
    rng = random.Random(0)
    for _ in range(120):
        t = "".join(rng.choice(_ATOMS) for _ in range(rng.randint(0, 300)))
        for mw in (1, 3, 32):
            a, b = chunk_text(t, mw), chunk_text_reference(t, mw)
            assert a.texts == b.texts, t
            assert np.array_equal(a.starts, b.starts) and np.array_equal(a.ends, b.ends)
            assert np.array_equal(a.n_words, b.n_words)
    # issue 9: punctuation before line breaks, lower-case line starts, list numbers, quoted ends
    atoms = _ATOMS + ["a = b.", "\nc = d.", "\n12. ", "3.", "\n7", " 1", "x'", "'.\n", ".)\n", "\n\tz", "q.\n\n"]
    for _ in range(120):
        t = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 300)))
        for mw in (1, 3, 32):
            a, b = chunk_text(t, mw), chunk_text_reference(t, mw)
            assert a.texts == b.texts, t
            assert np.array_equal(a.starts, b.starts) and np.array_equal(a.n_words, b.n_words)
    formats = [generate_hashhop(8000, 4, 0, fmt=f) for f in ("periods", "numbered", "prose", "bullets")]
    for s in (generate_hashhop(8000, 4, 0), generate_babilong("qa2", 8000, 0), *formats):
        for mw in (8, 32):
            a, b = chunk_text(s.document, mw), chunk_text_reference(s.document, mw)
            assert a.texts == b.texts and np.array_equal(a.starts, b.starts)


def test_whitespace_mask_is_str_isspace():
    latin1 = "".join(chr(c) for c in range(256)) * 3  # read as bytes
    for text in (latin1, "".join(chr(c) for c in range(0, 0x3100)) + "\U0001f600 \ud800", ""):
        np.testing.assert_array_equal(whitespace_mask(text), np.array([ch.isspace() for ch in text], dtype=bool))


@pytest.mark.parametrize(
    "cfg",
    [MixPRConfig(), MixPRConfig(stop_words="english"), MixPRConfig(lowercase=False), MixPRConfig(token_pattern=r"\S+"),
     MixPRConfig(token_pattern=r"\b\w\w+\b"), MixPRConfig(token_pattern=r"\d\d+")],
)  # fmt: skip
def test_count_terms_equals_countvectorizer(cfg):
    # the default word pattern reads ASCII texts without the regex engine (str.translate + split) and the
    # others with one findall over all of them; r"\d\d+" cannot read the sentinel: one findall per text
    rng = random.Random(1)
    sentinel = tfidf_module._SENTINEL
    atoms = ["ΣΑΣ", "Σ", "ς", "İstanbul", "the", "The", "a", "x_y", "12", "é", "\n", " ", "ǅ", "ﬁne", "Straße", "!!",
             "qzxjmixprsentinelqzxj", sentinel]  # fmt: skip
    ascii_atoms = ["the", "The", "a", "I", "x_y", "__", "_", "12", "3", "A1b2", "!!", "-", "'", "\t", "\x0b", "\x1c", "\x7f",
                   "e.g.", "don't", sentinel, sentinel.upper()]  # fmt: skip
    for pool in (atoms, ascii_atoms, atoms + ascii_atoms):
        texts = ["".join(rng.choice(pool) + rng.choice(" \n.") for _ in range(rng.randint(0, 12))) for _ in range(300)]
        counts, vocab = count_terms(texts, cfg)
        ref = CountVectorizer(lowercase=cfg.lowercase, token_pattern=cfg.token_pattern, stop_words=cfg.stop_words)
        R = ref.fit_transform(texts)
        assert list(vocab.get_feature_names_out()) == list(ref.get_feature_names_out())
        assert abs(counts - R).max() == 0
        assert abs(vocab.transform(texts[:5]) - ref.transform(texts[:5])).max() == 0


def test_tfidf_equals_sklearn_on_real_documents():
    for s in (generate_hashhop(20000, 3, 0), generate_babilong("qa3", 20000, 2)):
        texts = chunk_text(s.document).texts
        emb = embed_tfidf(texts)
        ref = TfidfVectorizer(dtype=np.float64).fit(texts)
        assert list(emb.counter.get_feature_names_out()) == list(ref.get_feature_names_out())
        assert abs(emb.matrix[emb.classes] - ref.transform(texts)).max() < 1e-6
        q = [s.question]
        assert abs(emb.transform(q) - ref.transform(q)).max() < 1e-6


# ---------------------------------------------------------------- the real bundled model


@pytest.mark.slow
def test_real_smollm2_router_and_reader_on_hashhop():
    from longrag.config import LLMConfig
    from longrag.llm import build_llm

    llm = build_llm(LLMConfig(backend="llamacpp", model="smollm2-135m-instruct", context_window=2048, n_threads=1))
    try:
        s = generate_hashhop(600, 2, seed=1)
        cfg = MixPRConfig(top_k=10, answer_max_tokens=16)
        pipe = LongContextPipeline(cfg, llm=llm)
        res = run(pipe.run(s.document, s.question, retriever="mixpr", route="auto"))
        assert res.route in ("local", "global")
        assert isinstance(res.answer, str)
        t = res.trace
        assert 0 < t["prompt_tokens"] <= llm.context_window - cfg.answer_max_tokens
        assert 0 < t["completion_tokens"] <= cfg.answer_max_tokens
        assert t["chunks_read"] >= 1 and t["context_tokens"] <= t["context_budget_tokens"]
        if res.route == "local":  # PPR from the question reaches both hops of the chain
            got = "\n".join(c["text"] for c in res.chunks)
            assert all(n in got for n in s.needle_texts())
        # a window too small for all 10 chunks: the reader drops some and still fits
        small_cfg = cfg.model_copy(update={"answer_max_tokens": 8, "reader_reserve_tokens": llm.context_window - 200})
        small = LongContextPipeline(small_cfg, llm=llm)
        res2 = run(small.run(s.document, s.question, route="local"))
        assert res2.trace["chunks_dropped"] > 0 and res2.trace["chunks_read"] >= 1
        assert res2.trace["context_tokens"] <= res2.trace["context_budget_tokens"]
    finally:
        run(llm.aclose())


def test_a_question_gets_the_short_answer_prompt_and_its_finishing():
    """With a question the reader asks for the answer alone and finishes it as the LongReader does;
    mixpr.short_answer=false and question-less documents keep the reply whole."""
    reply = "Answer: the blue box.\nIt is kept there."
    llm = ScriptedLLM([reply], context_window=4096)
    res = run(LongContextPipeline(MixPRConfig(top_k=3), llm=llm).run(DOC, QUESTION, retriever="sparse"))
    assert res.answer == "the blue box" and res.trace["raw_answer"] == reply
    assert "Reply with only the answer" in llm.calls[0]["messages"][-1]["content"]
    whole = ScriptedLLM([reply], context_window=4096)
    res = run(LongContextPipeline(MixPRConfig(top_k=3, short_answer=False), llm=whole).run(
        DOC, QUESTION, retriever="sparse"))
    assert res.answer == reply.strip() and "Reply with only the answer" not in whole.calls[0]["messages"][-1]["content"]
    no_q = ScriptedLLM([reply], context_window=4096)
    res = run(LongContextPipeline(MixPRConfig(top_k=3), llm=no_q).run(DOC, None, retriever="sparse"))
    assert res.answer == reply.strip()
    # the short answer has the bare prompt's 32-token budget; whole replies keep answer_max_tokens
    assert [c["max_tokens"] for c in (llm.calls[0], whole.calls[0], no_q.calls[0])] == [32, 128, 128]
    capped = ScriptedLLM([reply], context_window=4096)
    run(LongContextPipeline(MixPRConfig(top_k=3, answer_max_tokens=10), llm=capped).run(DOC, QUESTION, retriever="sparse"))
    assert capped.calls[0]["max_tokens"] == 10


def test_the_reader_reads_kept_chunks_with_the_documents_own_breaks():
    """Kept chunks that follow each other in the document are joined by what separated them there
    (space, line break, paragraph break); a gap where chunks were left out is a blank line; with
    every chunk kept the reader gets the document back, titles and paragraphs included."""
    from longrag.reading.longcontext import join_in_document_order
    from longrag.reading.prompts import direct_messages

    doc = "Title A\nFirst sentence.   Second sentence.\n\n\nTitle B\nThird one.\tFourth one."
    spans = [(0, 7), (8, 23), (26, 42), (45, 52), (53, 63), (64, 75)]
    assert [doc[a:b] for a, b in spans] == ["Title A", "First sentence.", "Second sentence.", "Title B",
                                            "Third one.", "Fourth one."]
    starts, ends = zip(*spans)
    assert join_in_document_order(doc, starts, ends) == \
        "Title A\nFirst sentence. Second sentence.\n\nTitle B\nThird one. Fourth one."
    keep = [0, 1, 4]  # "Second sentence." and "Title B" left out: a blank line where they were
    assert join_in_document_order(doc, [starts[i] for i in keep], [ends[i] for i in keep]) == \
        "Title A\nFirst sentence.\n\nThird one."
    assert join_in_document_order(doc, [], []) == ""

    llm = ScriptedLLM(["Motihari"], context_window=2048)
    paragraphs = ("Animal Farm\nAnimal Farm is a novella by George Orwell. It was published in 1945.\n\n"
                  "George Orwell\nOrwell was born in Motihari. He died in London in 1950.")
    asyncio.run(LongContextPipeline(MixPRConfig(), llm=llm).run(
        paragraphs, "Where was the author of Animal Farm born?", retriever="sparse", route="local", k=400))
    # the short answer is asked in the bare prompt's words (the long reader's direct prompt)
    assert llm.calls[0]["messages"] == direct_messages("Where was the author of Animal Farm born?", paragraphs)


def test_the_long_document_reader_cleans_its_reply_but_does_not_cut_it_to_a_span():
    """The span cut cost the long-document reader 1.2-1.6 F1 on bare-prompt replies (jobs.bench reader
    --document); its answer is the cleaned reply (prefix, quotes, trailing period), yes/no kept."""
    from longrag.reading.answers import finish_short_answer

    reply = "The novel Animal Farm was written by George Orwell."
    assert finish_short_answer(reply, "Who wrote Animal Farm?", "", "")[0] == "written by George Orwell"
    assert finish_short_answer(reply, "Who wrote Animal Farm?", "", "", cut_span=False)[0] == reply[:-1]
    llm = ScriptedLLM([f"Answer: {reply}"], context_window=2048)
    res = asyncio.run(LongContextPipeline(MixPRConfig(), llm=llm).run(
        "Animal Farm\nAnimal Farm is a novella by George Orwell.", "Who wrote Animal Farm?", retriever="sparse",
        route="local"))
    assert res.answer == reply[:-1]
