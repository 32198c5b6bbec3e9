"""The Ray Data callable that embeds chunks: one ``Embedder`` per actor in an actor pool.

``num_gpus``/``num_cpus`` come from ``EmbeddingConfig`` so the same job uses GPUs on a cluster
and fractional CPUs on a laptop; the device itself is picked by the core ``Embedder``.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np


class ChunkEmbedder:
    """Adds a ``vector`` column: ``column`` encoded as passages (chunks) or as queries (with the
    model's query instruction)."""

    def __init__(self, embedding_config: dict[str, Any], torch_threads: int = 1,
                 role: Literal["passage", "query"] = "passage", column: str = "text") -> None:
        import torch

        from longrag.config import EmbeddingConfig
        from longrag.index.embedding import Embedder

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(max(1, torch_threads))
        self.embedder = Embedder(EmbeddingConfig.model_validate(embedding_config))
        self.encode = self.embedder.encode_queries if role == "query" else self.embedder.encode_passages
        self.column = column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch["vector"] = self.encode([str(t) for t in batch[self.column]])
        return batch


def pool_options(embedding_config: Any) -> dict[str, Any]:
    """``map_batches`` options for :class:`ChunkEmbedder`: the pool sized from the CPUs/GPUs the
    connected Ray cluster offers (:func:`longrag.index.embedding.embedding_pool`)."""
    import ray

    from longrag.index.embedding import embedding_pool

    res = ray.cluster_resources()
    pool = embedding_pool(embedding_config, float(res.get("CPU", 1.0)), float(res.get("GPU", 0.0)))
    return {
        "fn_constructor_kwargs": {"embedding_config": embedding_config.model_dump(), "torch_threads": pool.torch_threads},
        "concurrency": pool.actors,
        "num_cpus": pool.num_cpus,
        "num_gpus": pool.num_gpus,
    }
