"""Which encoder a process builds: :class:`longrag.index.openvino_ir.IREncoder` (OpenVINO IR, no torch in
the process) or :class:`longrag.index.embedding.Embedder` (sentence-transformers on torch), by
``embedding.backend`` and the device the process runs on. The build's CPU embedding actors
(``actors.embedding.ChunkEmbedder``) and the serving replicas' question encoders come through here."""

from __future__ import annotations

import logging
from typing import Any

from longrag.config import EmbeddingConfig
from longrag.index.openvino_ir import openvino_available

log = logging.getLogger(__name__)

def resolve_backend(config: EmbeddingConfig, device: str, role: str = "query") -> str:
    """``embedding.backend`` for an encoder of ``role`` (``query``/``passage``) on ``device`` (``cpu`` or
    ``cuda``, as the process resolved it without torch): ``auto`` -> ``openvino-ir`` on a CPU where the
    encoder would be torch in float32 without quantization (the same vectors, checked at load), openvino is
    installed and, for passages, the vector cache is off (its vectors are torch's); ``torch`` otherwise."""
    if config.backend != "auto":
        return config.backend
    if (device.startswith("cpu") and config.quantize == "none" and config.dtype in ("auto", "float32")
            and not (role == "passage" and config.vector_cache) and openvino_available()):
        return "openvino-ir"
    return "torch"


def encoder(config: EmbeddingConfig, device: str = "cpu", threads: int = 1, role: str = "query") -> Any:
    """The encoder a process builds for ``role`` (``query``: a serving replica; ``passage``: a build's
    embedding actor) on ``device`` (``cpu``, ``cuda``, or ``auto`` for torch to resolve) with ``threads``
    CPU threads: an :class:`longrag.index.openvino_ir.IREncoder` (no torch in the process) where
    :func:`resolve_backend` says ``openvino-ir``, else an :class:`longrag.index.embedding.Embedder`.
    Both give ``dim``, ``encode_queries`` and ``encode_passages``. Where ``auto`` chose the IR and it fails
    to load (its export failed, the cache is not writable), the warning is logged with its traceback and
    torch runs instead; an explicit ``openvino-ir`` raises."""
    from longrag.index.embedding import Embedder
    from longrag.index.openvino_ir import IREncoder

    backend = resolve_backend(config, device, role)
    if backend == "openvino-ir":
        try:
            return IREncoder(config, threads=threads)
        except Exception:
            if config.backend != "auto":
                raise
            # auto chose it: torch gives the same vectors, so the process starts anyway, and says why
            log.warning("the OpenVINO IR encoder failed to load; running %s on torch", config.model, exc_info=True)
            backend = "torch"
    import torch

    torch.set_num_threads(max(1, threads))
    return Embedder(config.model_copy(update={"device": device, "backend": backend}))
