"""Query and document prompts, Matryoshka dimensions and the chunk room the prompt takes (issue 38).

The bundled MiniLM stands in for a model with prompts (configured here, or written into a folder's
``config_sentence_transformers.json``); one slow test loads the real EmbeddingGemma folder when
``make setup-embedder`` has assembled it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

torch.set_num_threads(1)

from longrag.config import EmbeddingConfig, LongRAGConfig  # noqa: E402
from longrag.index.embedding import (  # noqa: E402
    EMBEDDINGGEMMA,
    Embedder,
    ModelSpec,
    chunk_token_limit,
    embedding_dim,
    embedding_prompts,
    resolve_embedding_model,
)
from longrag.index.plan import BuildSettings, chunk_limits  # noqa: E402
from longrag.text.tokens import counter_for_model_dir  # noqa: E402

TEXTS = ["Paris is the capital and largest city of France.", "The mitochondrion is the powerhouse of the cell.",
         "Mount Everest is Earth's highest mountain above sea level."]
QUESTIONS = ["What is the capital of France?", "Which is the highest mountain?"]
GEMMA_LIKE = ModelSpec("gemma-like", "gemma-like", 768, 2048, None, matryoshka_dims=(768, 512, 256, 128))


@pytest.fixture(scope="module")
def plain() -> Embedder:
    return Embedder(EmbeddingConfig(device="cpu", batch_size=4))


@pytest.fixture(scope="module")
def minilm_with_prompts(tmp_path_factory) -> Path:
    """The bundled MiniLM folder (linked file by file) with query/document prompts in its config."""
    src = Path(resolve_embedding_model("all-MiniLM-L6-v2").path_or_name)
    dst = tmp_path_factory.mktemp("minilm-prompts")
    for path in src.rglob("*"):
        if path.is_file() and path.name != "config_sentence_transformers.json":
            (dst / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (dst / path.relative_to(src)).symlink_to(path)
    (dst / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "search query: ", "document": "search document: "}}))
    return dst


def test_configured_prompts_are_prepended_to_queries_and_documents(plain: Embedder) -> None:
    assert (plain.query_instruction, plain.document_instruction) == ("", "")  # MiniLM has none
    prompted = Embedder(EmbeddingConfig(device="cpu", batch_size=4, query_instruction="query: ",
                                        document_instruction="passage: "))
    assert (prompted.query_instruction, prompted.document_instruction) == ("query: ", "passage: ")
    docs, queries = prompted.encode_passages(TEXTS), prompted.encode_queries(QUESTIONS)
    np.testing.assert_allclose(docs, plain.encode_passages(["passage: " + t for t in TEXTS]), atol=1e-6)
    np.testing.assert_allclose(queries, plain.encode_queries(["query: " + q for q in QUESTIONS]), atol=1e-6)
    assert not np.allclose(docs, plain.encode_passages(TEXTS), atol=1e-3)  # the prompt changed the vectors


def test_prompts_come_from_the_model_folder_unless_the_config_sets_them(minilm_with_prompts: Path,
                                                                         plain: Embedder) -> None:
    folder = str(minilm_with_prompts)
    assert embedding_prompts(EmbeddingConfig(model=folder)) == ("search query: ", "search document: ")
    assert embedding_prompts(EmbeddingConfig(model=folder, query_instruction="", document_instruction="d: ")) == (
        "", "d: ")
    assert embedding_prompts(EmbeddingConfig()) == ("", "")
    assert embedding_prompts(EmbeddingConfig(model="bge-large-en-v1.5"))[1] == ""
    own = Embedder(EmbeddingConfig(model=folder, device="cpu"))
    np.testing.assert_allclose(own.encode_passages(TEXTS[:1]),
                               plain.encode_passages(["search document: " + TEXTS[0]]), atol=1e-6)
    np.testing.assert_allclose(own.encode_queries(QUESTIONS[:1]),
                               plain.encode_queries(["search query: " + QUESTIONS[0]]), atol=1e-6)


def test_chunks_leave_room_for_the_document_prompt(plain: Embedder) -> None:
    prompt = "title: none | text: "
    counter = counter_for_model_dir(plain.tokenizer_path)
    n = counter.count(prompt)
    assert n > 0 and counter.additive  # WordPiece: the prompt's tokens add up exactly
    base = LongRAGConfig()
    assert chunk_limits(base) == (256, 254)
    with_prompt = base.with_overrides([f"embedding.document_instruction='{prompt}'"])
    assert chunk_limits(with_prompt) == (256, 254 - n)
    prompted = Embedder(with_prompt.embedding.model_copy(update={"device": "cpu"}))
    assert prompted.max_chunk_tokens == 254 - n == chunk_token_limit(with_prompt.embedding, 256)
    # a chunk of exactly the limit fits the encoder with its prompt and special tokens
    chunk = counter.truncate(" ".join(["word"] * 400), prompted.max_chunk_tokens)
    assert counter.count(chunk) == prompted.max_chunk_tokens
    ids = prompted.model.tokenizer([prompt + chunk], truncation=False)["input_ids"][0]
    assert len(ids) == prompted.max_seq_length
    with pytest.raises(ValueError, match="at most"):
        chunk_limits(with_prompt.with_overrides([f"chunking.max_tokens={254 - n + 1}"]))
    # the document prompt and the dimension make the stored vectors: a build with another one is another build
    settings = BuildSettings.of(with_prompt)
    assert settings.diff(BuildSettings.of(base)) == ["embedding.document_instruction"]
    cut = BuildSettings.of(base.with_overrides(["embedding.dim=128"]))
    assert cut.diff(BuildSettings.of(base)) == ["embedding.dim"]
    assert "dim" not in BuildSettings.of(base).as_dict()["embedding"]  # earlier builds keep their fingerprint


def test_matryoshka_truncation_is_the_renormalized_prefix_of_the_full_vector(plain: Embedder) -> None:
    folder = resolve_embedding_model("all-MiniLM-L6-v2").path_or_name  # a plain folder: any cut is allowed
    full = plain.encode_passages(TEXTS)
    for dim in (256, 128):
        cut = Embedder(EmbeddingConfig(model=folder, device="cpu", dim=dim))
        assert cut.dim == dim
        vecs = cut.encode_passages(TEXTS)
        assert vecs.shape == (len(TEXTS), dim) and vecs.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-6)
        prefix = full[:, :dim] / np.linalg.norm(full[:, :dim], axis=1, keepdims=True)
        np.testing.assert_allclose(vecs, prefix, atol=1e-6)
        q = cut.encode_queries(QUESTIONS)
        assert q.shape == (len(QUESTIONS), dim)


def test_matryoshka_dimensions_are_checked_against_the_model() -> None:
    assert embedding_dim(EmbeddingConfig()) == 384
    for dim in (768, 512, 256, 128):
        assert embedding_dim(EmbeddingConfig(dim=dim), GEMMA_LIKE) == dim
    assert embedding_dim(EmbeddingConfig(), GEMMA_LIKE) == 768
    with pytest.raises(ValueError, match="768, 512, 256, 128"):
        embedding_dim(EmbeddingConfig(dim=300), GEMMA_LIKE)
    with pytest.raises(ValueError, match="not Matryoshka-trained"):
        embedding_dim(EmbeddingConfig(dim=128))  # MiniLM by name
    with pytest.raises(ValueError, match="normalize"):
        embedding_dim(EmbeddingConfig(dim=128, normalize=False), GEMMA_LIKE)
    with pytest.raises(ValueError):
        EmbeddingConfig(dim=0)


def test_a_build_manifest_records_the_cut_dimension_and_the_prompts(tmp_path: Path) -> None:
    from longrag.index.artifacts import ArtifactStore
    from longrag.index.plan import plan_build, start_build
    from longrag.types import Document

    folder = resolve_embedding_model("all-MiniLM-L6-v2").path_or_name
    config = LongRAGConfig().with_overrides([f"embedding.model={folder}", "embedding.dim=128", "units.kind=document",
                                             "embedding.document_instruction='passage: '"])
    docs = [Document(f"d{i}", f"Topic {i}", f"Topic {i} is about item {i}.", []) for i in range(4)]
    store = ArtifactStore.open(tmp_path / "build")
    start = start_build(store, plan_build(docs, config), resume=False, command=["test"])
    emb = store.read_manifest().embedding
    assert start.manifest.embedding == emb
    assert (emb.dim, emb.document_instruction, emb.query_instruction) == (128, "passage: ", None)


def test_embeddinggemma_names_its_make_target_when_it_is_not_assembled(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LONGRAG_MODEL_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="embeddinggemma-300m.*is not installed.*make setup-embedder"):
        resolve_embedding_model("embeddinggemma-300m")
    with pytest.raises(FileNotFoundError, match="make setup-embedder"):
        chunk_limits(LongRAGConfig().with_overrides(["embedding.model=embeddinggemma-300m"]))


# Files that may call sentence-transformers directly: the Embedder itself, and the dual pipeline's own
# fine-tuned reranker (a separate model, trained by jobs.train_reranker); gpu_check saves the MiniLM.
DIRECT_ENCODERS = {"longrag/index/embedding.py", "longrag/dual/rerank.py", "longrag/training/reranker.py",
                   "jobs/gpu_check.py"}


def test_every_encode_path_goes_through_the_embedder() -> None:
    """The builds, jobs.update, the query encoder deployment and the evaluation encode with
    Embedder.encode_passages / encode_queries (the prompts, the Matryoshka cut): nothing else loads or
    calls a sentence-transformers model."""
    import re

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"SentenceTransformer\(|\.model\.encode\(|\.encode_(query|document)\(")
    offenders = [str(p.relative_to(root)) for d in ("longrag", "actors", "serve", "jobs", "lab")
                 for p in sorted((root / d).rglob("*.py"))
                 if str(p.relative_to(root)) not in DIRECT_ENCODERS
                 and any(pattern.search(line) and not line.lstrip().startswith(("#", '"'))
                         for line in p.read_text().splitlines())]
    assert offenders == []


def _gemma_or_skip() -> Path:
    try:
        return Path(resolve_embedding_model(EMBEDDINGGEMMA).path_or_name)
    except FileNotFoundError as exc:
        pytest.skip(f"EmbeddingGemma is not assembled here ({exc})")


@pytest.mark.slow
def test_embeddinggemma_loads_with_its_own_prompts_and_dimensions() -> None:
    folder = _gemma_or_skip()
    own = json.loads((folder / "config_sentence_transformers.json").read_text())["prompts"]
    emb = Embedder(EmbeddingConfig(model=EMBEDDINGGEMMA, device="cpu", dtype="float32"))
    assert emb.dim == 768 and emb.max_seq_length == 2048
    assert (emb.query_instruction, emb.document_instruction) == (own["query"], own["document"])
    assert (own["query"], own["document"]) == ("task: search result | query: ", "title: none | text: ")
    assert emb.max_chunk_tokens < 2048 - 2 - 6  # the prompt's tokens are left free
    docs, q = emb.encode_passages(TEXTS), emb.encode_queries(QUESTIONS[:1])
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    # the same vectors as sentence-transformers' own prompt handling
    np.testing.assert_allclose(docs, emb.model.encode_document(TEXTS, normalize_embeddings=True), atol=1e-5)
    np.testing.assert_allclose(q, emb.model.encode_query(QUESTIONS[:1], normalize_embeddings=True), atol=1e-5)
    assert int(np.argmax(q @ docs.T)) == 0  # the capital of France
    cut = Embedder(EmbeddingConfig(model=EMBEDDINGGEMMA, device="cpu", dtype="float32", dim=128))
    small = cut.encode_passages(TEXTS)
    assert cut.dim == 128 and small.shape == (3, 128)
    np.testing.assert_allclose(small, docs[:, :128] / np.linalg.norm(docs[:, :128], axis=1, keepdims=True), atol=1e-5)
