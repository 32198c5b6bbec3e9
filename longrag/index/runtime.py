"""Where and how the encoder runs: the device and dtype ``auto`` resolves to, and the CPU runtimes
(torch's dynamic int8 quantization, OpenVINO) with the combinations they refuse. Used by
:class:`longrag.index.embedding.Embedder`."""

from __future__ import annotations

from typing import Any

import numpy as np

from longrag.config import EmbeddingConfig


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; anything else is passed through."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto`` -> ``float16`` on a GPU, ``float32`` elsewhere; anything else is passed through."""
    if dtype == "auto":
        return "float16" if device.startswith("cuda") else "float32"
    return dtype


def l2_normalized(vectors: np.ndarray) -> np.ndarray:
    """``vectors`` (float32, C-contiguous) with each row scaled to unit length in place, in float32 (a
    half-precision model's own norms are off by up to 0.35%); zero rows stay zero."""
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), np.float32(1e-12))
    return vectors


def torch_backend(backend: str) -> str:
    """What an :class:`longrag.index.embedding.Embedder` (sentence-transformers) runs for ``embedding.backend``:
    ``openvino`` (converted in memory) or torch — ``auto`` and ``openvino-ir`` pick the IR runtime only where
    :func:`longrag.index.embedding.encoder` builds the encoder."""
    return "openvino" if backend == "openvino" else "torch"


def check_runtime(config: EmbeddingConfig, device: str, dtype: str) -> None:
    """Refuse the combinations of ``embedding.quantize`` / ``embedding.backend`` with a device or dtype
    that cannot run them (ValueError naming the fields)."""
    if config.quantize == "int8" and (not device.startswith("cpu") or dtype != "float32"):
        raise ValueError(f"embedding.quantize=int8 is torch's dynamic quantization for CPUs: it needs device=cpu "
                         f"and dtype float32, not {device}/{dtype}")
    if config.backend == "openvino-ir" and (not device.startswith("cpu") or dtype != "float32"
                                            or config.quantize != "none"):
        raise ValueError(f"embedding.backend=openvino-ir runs on a CPU in float32 without quantization, not "
                         f"{device}/{dtype}/quantize={config.quantize}")
    if config.backend == "openvino":
        if not device.startswith("cpu") or dtype not in ("float32", "bfloat16"):
            raise ValueError(f"embedding.backend=openvino runs on a CPU in float32 or bfloat16, not {device}/{dtype}")
        if config.quantize != "none":
            raise ValueError("embedding.quantize applies to the torch backend only (backend=openvino)")


def quantize_int8(model: Any) -> None:
    """Dynamic int8 quantization of every ``torch.nn.Linear`` of ``model`` in place: int8 weights with a
    scale per output channel, activations quantized per batch (torch's fbgemm kernels on x86). Per channel,
    not per tensor: the bundled MiniLM's chunk vectors keep cosine 0.978 to float32's on average against 0.90.
    Embedding tables, norms and attention's matmuls stay float32."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch.ao's eager quantization is deprecated for torchao, still in torch 2.x
        warnings.simplefilter("ignore")
        quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)


def openvino_transformer(model: Any, dtype: str) -> None:
    """Replace the Hugging Face module inside a sentence-transformers ``Transformer`` with the same module
    exported (``torch.export``, batch and sequence length dynamic) and converted to OpenVINO in memory
    (``openvino.convert_model``), compiled for the CPU in ``dtype`` (float32 or bfloat16, OpenVINO's inference
    precision) with torch's thread count. Tokenizing, pooling and the dense layers stay sentence-transformers'
    (torch, float32). TorchScript tracing, OpenVINO's default, fails on Gemma 3's attention masks in
    transformers 5; the export takes ~10 s and the conversion ~40 s for EmbeddingGemma on 2 cores."""
    try:
        import openvino as ov
    except ImportError as err:
        raise ImportError("embedding.backend=openvino needs the openvino package (the cpu extra: make setup)") from err
    import torch
    from torch.export import Dim

    first = model[0]
    hf = first.model if hasattr(first, "model") else first.auto_model

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hf = hf

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.hf(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    example = first.tokenizer(["a sentence", "another, longer sentence"], padding=True, return_tensors="pt")
    limit = max(int(getattr(hf.config, "max_position_embeddings", 0) or 0), 16)
    shape = {0: Dim("batch", min=1, max=1 << 16), 1: Dim("tokens", min=2, max=limit)}
    with torch.no_grad():
        exported = torch.export.export(Hidden().eval(), (example["input_ids"], example["attention_mask"]),
                                       dynamic_shapes=(shape, shape), strict=False)
        converted = ov.convert_model(exported)
    compiled = ov.Core().compile_model(converted, "CPU", {
        "INFERENCE_PRECISION_HINT": "bf16" if dtype == "bfloat16" else "f32",
        "INFERENCE_NUM_THREADS": torch.get_num_threads(), "PERFORMANCE_HINT": "LATENCY"})

    class OpenVINOModule(torch.nn.Module):
        """The compiled model behind the Hugging Face module's forward: ``last_hidden_state`` as a float32
        tensor; one inference request per call, so concurrent callers never share one."""

        def __init__(self) -> None:
            super().__init__()
            self.config = hf.config  # sentence-transformers reads it (output_hidden_states)

        def forward(self, input_ids: Any = None, attention_mask: Any = None, **_: Any) -> dict[str, Any]:
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            out = compiled.create_infer_request().infer({0: input_ids.cpu().numpy(), 1: attention_mask.cpu().numpy()})
            return {"last_hidden_state": torch.from_numpy(np.asarray(out[compiled.output(0)], dtype=np.float32))}

    if hasattr(first, "model"):
        first.model = OpenVINOModule()
    else:  # pragma: no cover - sentence-transformers < 6
        first.auto_model = OpenVINOModule()
