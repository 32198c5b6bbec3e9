"""The question encoder without torch (issue 46, ask 2): the encoder exported to OpenVINO IR gives the
vectors sentence-transformers gives (through :class:`Embedder`, torch), in a process that never imports
torch; a folder whose vectors drifted is refused; ``embedding.backend=auto`` picks it where it holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from longrag.config import EmbeddingConfig
from longrag.index.embedding import Embedder
from longrag.index.encoders import resolve_backend
from longrag.index.openvino_ir import IREncoder, ensure_ir, ir_folder, ir_key

QUESTIONS = ["Who wrote the novel Animal Farm?", "  which river feeds Victoria Falls?  ", "x",
             "Ünïcödé — «quotes» and 数字 123?", "Mosi-oa-Tunya " * 400]
PASSAGES = ["The Zambezi is the fourth-longest river in Africa.", "", "Victoria Falls " * 300]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models") / "openvino"  # as under $LONGRAG_MODEL_CACHE


@pytest.fixture(scope="module")
def folder(root) -> Path:
    return ensure_ir(EmbeddingConfig(), root)  # exported in a subprocess, as a replica would


@pytest.fixture(scope="module")
def torch_embedder() -> Embedder:
    return Embedder(EmbeddingConfig())


def test_vectors_equal_the_torch_encoders(folder, torch_embedder):
    ir = IREncoder(EmbeddingConfig(), folder=folder)
    assert ir.dim == torch_embedder.dim == 384 and ir.max_seq_length == torch_embedder.max_seq_length
    for got, want in ((ir.encode_queries(QUESTIONS), torch_embedder.encode_queries(QUESTIONS)),
                      (ir.encode_passages(PASSAGES), torch_embedder.encode_passages(PASSAGES))):
        assert got.dtype == np.float32 and got.flags["C_CONTIGUOUS"] and got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=2e-5)
        assert (got * want).sum(1).min() >= 0.9999
    assert ir.encode_queries([]).shape == (0, 384)
    with pytest.raises(ValueError):
        ir.encode_queries([None])  # type: ignore[list-item]


def test_prompts_are_prepended_as_the_embedder_prepends_them(root):
    config = EmbeddingConfig(document_instruction="passage: ", query_instruction="query: ")
    ir = IREncoder(config, folder=ensure_ir(config, root))
    torch_embedder = Embedder(config)
    np.testing.assert_allclose(ir.encode_queries(QUESTIONS[:2]), torch_embedder.encode_queries(QUESTIONS[:2]), atol=2e-5)
    np.testing.assert_allclose(ir.encode_passages(PASSAGES[:1]), torch_embedder.encode_passages(PASSAGES[:1]), atol=2e-5)
    assert ir_folder(config, root) != ir_folder(EmbeddingConfig(), root)  # the prompts are part of the key


def test_a_process_that_loads_the_folder_never_imports_torch(folder):
    code = ("import sys, json; from longrag.config import EmbeddingConfig; "
            "from longrag.index.encoders import encoder; "
            "e = encoder(EmbeddingConfig(), 'cpu', 1); v = e.encode_queries(['Who wrote Animal Farm?']); "
            "print(json.dumps({'folder': str(e.folder), 'torch': 'torch' in sys.modules, "
            "'st': 'sentence_transformers' in sys.modules, 'norm': float((v * v).sum())}))")
    env = {**os.environ, "LONGRAG_MODEL_CACHE": str(folder.parent.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"folder": str(folder), "torch": False, "st": False, "norm": pytest.approx(1.0, abs=1e-5)}


def test_a_folder_whose_vectors_drifted_is_refused(folder, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in folder.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    meta = json.loads((bad / "encoder.json").read_text())
    meta["probe_vectors"][1] = list(np.roll(meta["probe_vectors"][1], 1))  # not what the model gives
    (bad / "encoder.json").write_text(json.dumps(meta))
    with pytest.raises(RuntimeError, match="other vectors than torch.*delete the folder"):
        IREncoder(EmbeddingConfig(), folder=bad)


def test_a_failed_export_names_its_cause(tmp_path):
    with pytest.raises(RuntimeError, match="exporting .* failed"):
        ensure_ir(EmbeddingConfig(model=str(tmp_path / "no-such-model")), tmp_path)


def test_the_key_follows_what_changes_the_tokens():
    base = ir_key(EmbeddingConfig())
    assert ir_key(EmbeddingConfig(batch_size=7, dim=None, normalize=True)) == base  # applied after the graph
    assert ir_key(EmbeddingConfig(max_seq_length=128)) != base


def test_backend_auto_is_openvino_ir_only_where_it_gives_the_same_vectors():
    assert resolve_backend(EmbeddingConfig(), "cpu") == "openvino-ir"
    assert resolve_backend(EmbeddingConfig(), "cpu", "passage") == "openvino-ir"
    assert resolve_backend(EmbeddingConfig(vector_cache=True), "cpu", "passage") == "torch"  # torch's vectors cached
    assert resolve_backend(EmbeddingConfig(vector_cache=True), "cpu", "query") == "openvino-ir"
    assert resolve_backend(EmbeddingConfig(), "cuda") == "torch"
    assert resolve_backend(EmbeddingConfig(quantize="int8"), "cpu") == "torch"
    assert resolve_backend(EmbeddingConfig(dtype="bfloat16"), "cpu") == "torch"
    assert resolve_backend(EmbeddingConfig(backend="openvino"), "cpu") == "openvino"
    assert resolve_backend(EmbeddingConfig(backend="torch"), "cpu") == "torch"
    assert resolve_backend(EmbeddingConfig(backend="openvino-ir"), "cuda") == "openvino-ir"


def test_the_torch_encoder_takes_auto_and_refuses_openvino_ir_where_it_cannot_run(monkeypatch, caplog):
    from longrag.index import openvino_ir
    from longrag.index.encoders import encoder

    assert type(encoder(EmbeddingConfig(backend="torch"), "cpu")).__name__ == "Embedder"
    assert Embedder(EmbeddingConfig()).config.backend == "torch"  # the torch class runs auto as torch
    with pytest.raises(ValueError, match="openvino-ir runs on a CPU in float32"):
        encoder(EmbeddingConfig(backend="openvino-ir", quantize="int8"), "cpu")

    def failed_export(config, root=None):
        raise RuntimeError("exporting all-MiniLM-L6-v2 to OpenVINO IR failed (exit 1): disk full")

    monkeypatch.setattr(openvino_ir, "ensure_ir", failed_export)
    # auto chose the IR: torch instead, and the log says why; asked for by name: the error
    assert type(encoder(EmbeddingConfig(), "cpu")).__name__ == "Embedder"
    assert "OpenVINO IR encoder failed to load" in caplog.text and "disk full" in caplog.text
    with pytest.raises(RuntimeError, match="disk full"):
        encoder(EmbeddingConfig(backend="openvino-ir"), "cpu")


@pytest.mark.slow
def test_embeddinggemma_with_its_prompt_dense_layers_and_a_matryoshka_cut(tmp_path):
    """EmbeddingGemma (make setup-embedder): the query prompt, a SentencePiece tokenizer, two dense layers
    after pooling, and vectors cut to 256 then normalized — all as the torch encoder does."""
    config = EmbeddingConfig(model="embeddinggemma-300m", dim=256, batch_size=4)
    ir = IREncoder(config, folder=ensure_ir(config, tmp_path))
    gemma = Embedder(config)
    assert ir.dim == gemma.dim == 256
    np.testing.assert_allclose(ir.encode_queries(QUESTIONS[:4]), gemma.encode_queries(QUESTIONS[:4]), atol=1e-4)
    np.testing.assert_allclose(ir.encode_passages(PASSAGES[:1]), gemma.encode_passages(PASSAGES[:1]), atol=1e-4)
