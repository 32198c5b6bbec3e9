"""Chunks tokenized apart from the encoder (issue 46, ask 3): :class:`PassageTokenizer` gives the ids
sentence-transformers' own tokenization gives, and :meth:`Embedder.encode_features` over its padded,
length-bucketed batches gives the vectors of :meth:`Embedder.encode_passages` (sentence-transformers'
``encode``) — the references are the library's, never this module's."""

from __future__ import annotations

import numpy as np
import pytest

from longrag.config import EmbeddingConfig
from longrag.index.embedding import Embedder
from longrag.index.tokenized import PAD_MULTIPLE, PassageTokenizer

TEXTS = [
    "The Zambezi is the fourth-longest river in Africa.",
    "  Victoria Falls lies on the Zambezi, between Zambia and Zimbabwe.  ",
    "",
    "x",
    "Mosi-oa-Tunya " * 400,  # past the 256-token input limit: truncated as the model truncates
    "Ünïcödé text — with dashes, «quotes» and 数字 123.",
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(EmbeddingConfig())


def _library_ids(embedder: Embedder, texts: list[str], prompt: str) -> list[np.ndarray]:
    model = embedder.model
    preprocess = getattr(model, "preprocess", None) or model.tokenize
    enc = preprocess([prompt + t for t in texts])
    return [ids[mask.bool()].numpy() for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]


def test_ids_equal_sentence_transformers_tokenization(embedder):
    tok = PassageTokenizer(EmbeddingConfig())
    got = tok.token_ids(TEXTS)
    want = _library_ids(embedder, TEXTS, embedder.document_instruction)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert max(len(g) for g in got) == tok.max_seq_length == embedder.max_seq_length == 256
    assert all(g.dtype == np.int32 for g in got)


def test_a_prompt_is_prepended_as_the_embedder_prepends_it(embedder):
    config = EmbeddingConfig(document_instruction="passage: ", query_instruction="query: ")
    prompted = Embedder(config)
    for role, prompt in (("passage", "passage: "), ("query", "query: ")):
        got = PassageTokenizer(config, role=role).token_ids(TEXTS[:3])
        assert [g.tolist() for g in got] == [w.tolist() for w in _library_ids(prompted, TEXTS[:3], prompt)]


def test_pad_is_length_rounded_masked_and_on_the_tokenizers_side():
    tok = PassageTokenizer(EmbeddingConfig())
    ids = [np.array([101, 7, 102], np.int32), np.array([101, 102], np.int32), np.arange(9, dtype=np.int32)]
    out = tok.pad(ids)
    assert out["input_ids"].shape == (3, 16) and out["input_ids"].dtype == np.int64
    assert out["attention_mask"].sum(1).tolist() == [3, 2, 9]
    assert out["input_ids"][0, :3].tolist() == [101, 7, 102] and (out["input_ids"][0, 3:] == tok.pad_id).all()
    assert not out["token_type_ids"].any()
    tok.left_padding = True
    left = tok.pad(ids)
    assert left["input_ids"][1, -2:].tolist() == [101, 102] and left["attention_mask"][1, :-2].sum() == 0
    assert all(x.shape[1] % PAD_MULTIPLE == 0 for x in (out["input_ids"], left["input_ids"]))


def test_bucketed_batches_give_the_vectors_of_encode_passages(embedder):
    texts = TEXTS * 3 + [f"Chunk {i}: " + "the river runs on " * (i % 40) for i in range(40)]
    tok = PassageTokenizer(EmbeddingConfig())
    got = np.zeros((len(texts), embedder.dim), np.float32)
    seen: list[int] = []
    widths = []
    for rows, features in tok.batches(texts, batch_size=8):
        got[rows] = embedder.encode_features(features)
        seen += rows.tolist()
        widths.append(features["input_ids"].shape[1])
    assert sorted(seen) == list(range(len(texts)))
    assert widths == sorted(widths)  # length-bucketed: short batches first, little padding
    want = embedder.encode_passages(texts)
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert embedder.encode_features({"input_ids": np.zeros((0, 8), np.int64)}).shape == (0, embedder.dim)
    with pytest.raises(ValueError, match="batch_size"):
        next(tok.batches(texts, 0))


def test_the_ray_data_callables_without_ray_equal_the_one_stage_embedder():
    """``ChunkTokenizer`` then ``TokenEmbedder`` (the GPU layout) against ``ChunkEmbedder``: the rows come back
    whole (sorted by length), every vector the same."""
    from actors.embedding import ChunkEmbedder, ChunkTokenizer, TokenEmbedder

    emb = EmbeddingConfig(batch_size=4).model_dump()
    batch = {"i": np.arange(len(TEXTS)), "text": np.array(TEXTS, dtype=object)}
    want = ChunkEmbedder(emb)({k: v.copy() for k, v in batch.items()})["vector"]
    tokenized = ChunkTokenizer(emb)({k: v.copy() for k, v in batch.items()})
    lengths = [len(x) for x in tokenized["input_ids"]]
    assert lengths == sorted(lengths) and sorted(tokenized["i"].tolist()) == list(range(len(TEXTS)))
    out = TokenEmbedder(emb)(tokenized)
    assert "input_ids" not in out
    assert [str(t) for t in out["text"]] == [TEXTS[i] for i in out["i"]]
    np.testing.assert_allclose(out["vector"], want[out["i"]], atol=2e-6)


def test_the_stage_is_chosen_for_gpu_pools_unless_set():
    from actors.embedding import tokenizes_in_stage

    assert not tokenizes_in_stage(EmbeddingConfig(), gpus=0)
    assert not tokenizes_in_stage(EmbeddingConfig(num_gpus=1), gpus=0)  # no GPU to grow to: the CPU layout
    assert tokenizes_in_stage(EmbeddingConfig(num_gpus=0.5), gpus=4)
    assert tokenizes_in_stage(EmbeddingConfig(tokenize="stage"), gpus=0)
    assert not tokenizes_in_stage(EmbeddingConfig(num_gpus=1, tokenize="actor"), gpus=4)


@pytest.mark.slow
def test_embeddinggemma_prompt_and_matryoshka_cut_through_the_token_path():
    """EmbeddingGemma (make setup-embedder): its own document prompt, a SentencePiece tokenizer with
    ``<bos>``/``<eos>``, dense layers after pooling and a Matryoshka cut to 256."""
    config = EmbeddingConfig(model="embeddinggemma-300m", dim=256, batch_size=4)
    gemma = Embedder(config)
    tok = PassageTokenizer(config)
    assert tok.prompt == gemma.document_instruction != ""
    texts = TEXTS[:4] + ["Harare is the capital of Zimbabwe."]
    got = [g.tolist() for g in tok.token_ids(texts)]
    assert got == [w.tolist() for w in _library_ids(gemma, texts, gemma.document_instruction)]
    out = np.zeros((len(texts), 256), np.float32)
    for rows, features in tok.batches(texts, batch_size=2):
        out[rows] = gemma.encode_features(features)
    np.testing.assert_allclose(out, gemma.encode_passages(texts), atol=5e-5)
