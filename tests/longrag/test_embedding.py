"""Embedding: model registry and the bundled MiniLM encoder against a hand-written reference."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

torch.set_num_threads(1)

from longrag.config import EmbeddingConfig  # noqa: E402
from longrag.index.embedding import (  # noqa: E402
    BGE_INSTRUCTION,
    Embedder,
    ModelSpec,
    resolve_device,
    resolve_embedding_model,
)

TEXTS = [
    "Paris is the capital and largest city of France.",
    "The mitochondrion is the powerhouse of the cell.",
    "Mount Everest is Earth's highest mountain above sea level.",
    "",
    "A much longer passage " * 40,
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(EmbeddingConfig(device="cpu", batch_size=4))


def test_registry() -> None:
    spec = resolve_embedding_model("all-MiniLM-L6-v2")
    assert spec.bundled and (spec.dim, spec.max_seq_length, spec.query_instruction) == (384, 256, None)
    assert (Path(spec.path_or_name) / "model.safetensors").is_file()
    assert "site-packages" in spec.path_or_name
    for name in ("bge-large-en-v1.5", "BAAI/bge-large-en-v1.5"):
        bge = resolve_embedding_model(name)
        assert (bge.path_or_name, bge.dim, bge.max_seq_length) == ("BAAI/bge-large-en-v1.5", 1024, 512)
        assert bge.query_instruction == BGE_INSTRUCTION and not bge.bundled
    assert resolve_embedding_model("/models/e5") == ModelSpec("/models/e5", "/models/e5", None, None, None)
    with pytest.raises(ValueError):
        resolve_embedding_model("  ")
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def reference_minilm(texts: list[str], max_len: int = 256) -> np.ndarray:
    """Mean pooling over the transformer output + L2 normalization, written out by hand."""
    from transformers import AutoModel, AutoTokenizer

    path = resolve_embedding_model("all-MiniLM-L6-v2").path_or_name
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


def test_bundled_model_matches_reference(embedder: Embedder) -> None:
    assert embedder.dim == 384 and embedder.max_seq_length == 256 and embedder.device == "cpu"
    vecs = embedder.encode_passages(TEXTS)
    assert vecs.dtype == np.float32 and vecs.shape == (len(TEXTS), 384) and vecs.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vecs, reference_minilm(TEXTS), atol=2e-5)


def test_queries_and_similarity(embedder: Embedder) -> None:
    assert embedder.query_instruction == ""
    q = embedder.encode_queries(["What is the capital of France?", "highest mountain on earth"])
    p = embedder.encode_passages(TEXTS[:3])
    assert q.shape == (2, 384) and q.dtype == np.float32
    sims = q @ p.T
    assert sims[0].argmax() == 0 and sims[1].argmax() == 2
    np.testing.assert_allclose(embedder.encode_queries(["x y"]), embedder.encode_passages(["x y"]), atol=1e-6)


def test_empty_and_bad_inputs(embedder: Embedder) -> None:
    out = embedder.encode_passages([])
    assert out.shape == (0, 384) and out.dtype == np.float32
    with pytest.raises(ValueError, match="one string"):
        embedder.encode_passages("a single string")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected str"):
        embedder.encode_queries(["ok", None])  # type: ignore[list-item]


def test_tokenizer_path_and_counts(embedder: Embedder) -> None:
    from tokenizers import Tokenizer

    path = Path(embedder.tokenizer_path)
    assert (path / "tokenizer.json").is_file()
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.no_padding()  # the bundled tokenizer.json pads and truncates to 128 by default
    tok.no_truncation()
    texts = TEXTS[:3] + ["word " * 300]
    expected = [len(tok.encode(t, add_special_tokens=False).ids) for t in texts]
    assert embedder.count_tokens(texts) == expected
    assert expected[-1] == 300  # no truncation in counting


def test_config_options() -> None:
    cfg = EmbeddingConfig(device="cpu", query_instruction="query: ", normalize=False, max_seq_length=16)
    emb = Embedder(cfg)
    assert emb.max_seq_length == 16 and emb.query_instruction == "query: "
    raw = emb.encode_passages(TEXTS[:2])
    # all-MiniLM-L6-v2 ends in its own Normalize module, so even normalize=False gives unit vectors.
    np.testing.assert_allclose(raw, reference_minilm(TEXTS[:2], max_len=16), atol=2e-5)
    np.testing.assert_allclose(emb.encode_queries(["who"]), emb.encode_passages(["query: who"]), atol=1e-6)


def test_half_precision_gives_float32_vectors_close_to_the_reference() -> None:
    """embedding.dtype: bfloat16 (what a CPU runs of the half types) against the hand-written
    float32 mean-pool reference; auto is float32 on a CPU and float16 on a GPU."""
    from longrag.index.embedding import resolve_dtype

    assert resolve_dtype("auto", "cpu") == "float32" and resolve_dtype("auto", "cuda:1") == "float16"
    assert resolve_dtype("bfloat16", "cuda") == "bfloat16"
    emb = Embedder(EmbeddingConfig(device="cpu", dtype="bfloat16", max_seq_length=32))
    assert emb.dtype == "bfloat16" and "bfloat16" in repr(emb)
    got = emb.encode_passages(TEXTS[:3])
    assert got.dtype == np.float32
    # Unit norm in float32 whatever the model's dtype (issue 38: on an AVX2-only CPU bfloat16 norms
    # were off by up to 0.35%, so inner product was no longer cosine).
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    ref = reference_minilm(TEXTS[:3], max_len=32)
    cosine = np.sum(got * ref, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    assert cosine.min() > 0.99 and cosine.max() < 0.999999  # close, and really computed in bfloat16
    assert Embedder(EmbeddingConfig(device="cpu")).dtype == "float32"
    with pytest.raises(ValueError):
        EmbeddingConfig(dtype="int8")


def test_tokenizer_of_a_hub_model_resolves_in_the_hub_cache(tmp_path, monkeypatch) -> None:
    """Issue 9: ``--set embedding.model=bge-large-en-v1.5`` failed with "no tokenizer": the hub name
    was taken for a folder. The tokenizer is found in the model's Hugging Face cache snapshot,
    without loading the model; a model in no cache gets an error saying how to fetch it."""
    from longrag.index.embedding import tokenizer_dir
    from longrag.text.tokens import counter_for_model_dir
    from tests.hub_cache import fake_hub_cache

    snapshot = fake_hub_cache(tmp_path / "hub", "BAAI/bge-large-en-v1.5", monkeypatch)
    for name in ("bge-large-en-v1.5", "BAAI/bge-large-en-v1.5", resolve_embedding_model("bge-large-en-v1.5")):
        assert Path(tokenizer_dir(name)) == snapshot
    counter = counter_for_model_dir(tokenizer_dir("bge-large-en-v1.5"))
    assert counter.count("Paris is the capital of France.") == 7
    assert Path(tokenizer_dir("all-MiniLM-L6-v2")) == Path(resolve_embedding_model("all-MiniLM-L6-v2").path_or_name)
    with pytest.raises(FileNotFoundError, match="huggingface-cli download intfloat/e5-large-v2"):
        tokenizer_dir("intfloat/e5-large-v2")
