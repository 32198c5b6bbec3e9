"""embedding.quantize / embedding.backend on the bundled MiniLM: int8 dynamic quantization and OpenVINO give
float32, unit-norm vectors close to the hand-written float32 reference (tests/longrag/test_embedding.py);
combinations that cannot run are refused."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

torch.set_num_threads(1)

from longrag.config import EmbeddingConfig  # noqa: E402
from longrag.index.embedding import Embedder, check_runtime  # noqa: E402
from tests.longrag.test_embedding import reference_minilm  # noqa: E402

TEXTS = [
    "Paris is the capital and largest city of France.",
    "The mitochondrion is the powerhouse of the cell.",
    "Mount Everest is Earth's highest mountain above sea level, on the border of Nepal and China.",
    "A much longer passage about the history of the Roman Empire and its provinces " * 12,
]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_int8_vectors_are_unit_norm_and_close_to_float32() -> None:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    embedder = Embedder(EmbeddingConfig(device="cpu", quantize="int8", batch_size=2))
    linears = [m for m in embedder.model.modules() if isinstance(m, torch.nn.Linear)]
    quantized = [m for m in embedder.model.modules() if isinstance(m, DynamicLinear)]
    assert not linears and len(quantized) == 37  # every Linear: 6 in each of MiniLM's 6 layers, and BERT's pooler
    vectors = embedder.encode_passages(TEXTS)
    assert vectors.dtype == np.float32 and vectors.flags["C_CONTIGUOUS"] and vectors.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    cos = _cosines(vectors, reference_minilm(TEXTS))
    assert cos.min() > 0.95, cos  # per-channel int8 (per-tensor scales drop MiniLM to ~0.87 on chunks)
    assert cos.max() < 0.999999  # really quantized, not float32
    queries = embedder.encode_queries(["What is the capital of France?"])
    assert int(np.argmax(queries @ vectors.T)) == 0


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino not installed (extra openvino)")
def test_openvino_backend_matches_the_float32_reference() -> None:
    embedder = Embedder(EmbeddingConfig(device="cpu", backend="openvino", batch_size=4))
    assert "openvino" in repr(embedder)
    vectors = embedder.encode_passages(TEXTS)  # one batch with padding: lengths differ
    assert vectors.dtype == np.float32 and vectors.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert _cosines(vectors, reference_minilm(TEXTS)).min() > 0.9999
    alone = np.concatenate([embedder.encode_passages([t]) for t in TEXTS])  # other shapes than the example's
    assert _cosines(alone, vectors).min() > 0.9999


@pytest.mark.parametrize("fields, device, dtype, message", [
    ({"quantize": "int8"}, "cpu", "bfloat16", "quantize=int8"),
    ({"quantize": "int8"}, "cuda", "float16", "quantize=int8"),
    ({"backend": "openvino"}, "cuda", "float32", "backend=openvino"),
    ({"backend": "openvino"}, "cpu", "float16", "backend=openvino"),
    ({"backend": "openvino", "quantize": "int8"}, "cpu", "float32", "torch backend only"),
])
def test_combinations_that_cannot_run_are_refused(fields, device, dtype, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_runtime(EmbeddingConfig(**fields), device, dtype)
    check_runtime(EmbeddingConfig(), device, dtype)  # the defaults run anywhere


def test_config_refuses_unknown_values() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        EmbeddingConfig(quantize="int4")
    with pytest.raises(ValidationError):
        EmbeddingConfig(backend="onnx")
