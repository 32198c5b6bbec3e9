"""The Ray Data callable that embeds chunks: one ``Embedder`` per actor in an actor pool.

``num_gpus``/``num_cpus`` come from ``EmbeddingConfig`` so the same job uses GPUs on a cluster
and fractional CPUs on a laptop; the device itself is picked by the core ``Embedder``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np


class ChunkEmbedder:
    def __init__(self, embedding_config: dict[str, Any], torch_threads: int = 1) -> None:
        import torch

        from longrag.config import EmbeddingConfig
        from longrag.embedding import Embedder

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(max(1, torch_threads))
        self.embedder = Embedder(EmbeddingConfig.model_validate(embedding_config))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch["text"]]
        batch["vector"] = self.embedder.encode_passages(texts)
        return batch
