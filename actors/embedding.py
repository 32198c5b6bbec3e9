"""The Ray Data callable that embeds chunks: one ``Embedder`` per actor in an actor pool.

``num_gpus``/``num_cpus`` come from ``EmbeddingConfig`` so the same job uses GPUs on a cluster
and fractional CPUs on a laptop; the device itself is picked by the core ``Embedder``.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any, Literal

import numpy as np

from cluster import ray_private

log = logging.getLogger(__name__)


class ChunkEmbedder:
    """Adds a ``vector`` column: ``column`` encoded as passages (chunks) or as queries (with the
    model's query instruction)."""

    def __init__(self, embedding_config: dict[str, Any], torch_threads: int = 1,
                 role: Literal["passage", "query"] = "passage", column: str = "text") -> None:
        from longrag.config import EmbeddingConfig
        from longrag.index.encoders import encoder

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        config = EmbeddingConfig.model_validate(embedding_config)
        # an actor without a GPU share runs on the CPU (backend auto: OpenVINO IR there, no torch)
        device = "cpu" if config.num_gpus == 0 and config.device == "auto" else config.device
        self.embedder = encoder(config, device, torch_threads, role)
        log.info("embedding actor: %r", self.embedder)
        self.encode = self.embedder.encode_queries if role == "query" else self.embedder.encode_passages
        self.column = column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch["vector"] = self.encode([str(t) for t in batch[self.column]])
        return batch


class ChunkTokenizer:
    """Ray Data CPU stage before a pool of :class:`TokenEmbedder`: adds ``input_ids`` (each row's token ids,
    int32, as the encoder sees them: :class:`longrag.index.tokenized.PassageTokenizer`) and returns the
    batch's rows sorted by length, so the pool's batches pad little (length-bucketed)."""

    def __init__(self, embedding_config: dict[str, Any], role: Literal["passage", "query"] = "passage",
                 column: str = "text") -> None:
        from longrag.config import EmbeddingConfig
        from longrag.index.tokenized import PassageTokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.tokenizer = PassageTokenizer(EmbeddingConfig.model_validate(embedding_config), role=role)
        self.column = column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        from longrag.index.tokenized import length_order

        ids = self.tokenizer.token_ids([str(t) for t in batch[self.column]])
        order = length_order(ids)
        out: dict[str, Any] = {k: np.asarray(v)[order] for k, v in batch.items()}
        out["input_ids"] = [ids[i] for i in order]
        return out


class TokenEmbedder:
    """Ray Data actor after :class:`ChunkTokenizer`: pads each batch's ``input_ids`` and runs the model
    (:meth:`longrag.index.embedding.Embedder.encode_features`), replacing them with ``vector``."""

    def __init__(self, embedding_config: dict[str, Any], torch_threads: int = 1,
                 role: Literal["passage", "query"] = "passage") -> None:
        import torch

        from longrag.config import EmbeddingConfig
        from longrag.index.embedding import Embedder
        from longrag.index.tokenized import PassageTokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(max(1, torch_threads))
        config = EmbeddingConfig.model_validate(embedding_config)
        self.embedder = Embedder(config)
        self.tokenizer = PassageTokenizer(config, role=role)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        ids = batch.pop("input_ids")
        batch["vector"] = self.embedder.encode_features(self.tokenizer.pad([np.asarray(x) for x in ids]))
        return batch


def tokenizes_in_stage(embedding_config: Any, gpus: float) -> bool:
    """``embedding.tokenize``: ``stage`` or ``actor``; ``auto`` is a stage when the pool runs on GPUs."""
    if embedding_config.tokenize != "auto":
        return bool(embedding_config.tokenize == "stage")
    return bool(embedding_config.num_gpus > 0 and gpus > 0)


def embed(ds: Any, embedding_config: Any, *, role: Literal["passage", "query"] = "passage",
          column: str = "text", opts: dict[str, Any] | None = None) -> Any:
    """``ds`` with a ``vector`` column: ``column`` encoded by the embedding pool (``opts``, by default
    :func:`pool_options`), either in one stage (:class:`ChunkEmbedder`) or, per ``embedding.tokenize``,
    tokenized by an autoscaling pool of CPU actors (up to :data:`longrag.index.tokenized.TOKENIZERS_PER_GPU`
    per embedding actor, within the cluster's CPUs) and embedded by :class:`TokenEmbedder`."""
    from ray.data import ActorPoolStrategy

    from longrag.index.embedding import CHUNKER_CPUS
    from longrag.index.tokenized import TOKENIZERS_PER_GPU

    capacity = cluster_capacity()
    grow = capacity[0]
    opts = copy.deepcopy(opts) if opts is not None else pool_options(embedding_config, capacity)
    emb = embedding_config
    if not tokenizes_in_stage(emb, grow.get("GPU", 0.0)):
        opts["fn_constructor_kwargs"].update(role=role, column=column)
        return ds.map_batches(ChunkEmbedder, batch_size=emb.batch_size, **opts)
    actors = opts["compute"].max_size or 1
    spare = int(grow.get("CPU", 1.0) - actors * opts["num_cpus"])  # whole CPUs beside the pool at its largest
    tokenizers = max(1, min(spare, TOKENIZERS_PER_GPU * actors))
    num_cpus = 1.0 if spare >= 1 else CHUNKER_CPUS  # a small machine: a share, as the chunker beside it
    log.info("tokenizing in a stage before the pool: 1 up to %d CPU actor(s) of %g CPU", tokenizers, num_cpus)
    ds = ds.map_batches(ChunkTokenizer, batch_size=max(emb.batch_size * 8, 256), num_cpus=num_cpus,
                        compute=ActorPoolStrategy(min_size=1, max_size=tokenizers),
                        fn_constructor_kwargs={"embedding_config": emb.model_dump(), "role": role, "column": column})
    opts["fn_constructor_kwargs"].update(role=role)
    return ds.map_batches(TokenEmbedder, batch_size=emb.batch_size, **opts)


def cluster_capacity() -> tuple[dict[str, float], dict[str, float], str]:
    """What the connected cluster can grow to, what is up now, and where the first came from.

    An autoscaling cluster may start with no worker node up (a head with 0 CPUs): what it can grow
    to is its node types at their ``max_workers``, as the autoscaler's cluster config in the GCS
    says (:func:`cluster.ray_private.max_resources_from_cluster_config`, which Ray Data reads
    too; ``cluster/aws.yaml``'s head and :mod:`cluster.fake` publish it with
    :func:`cluster.node_types.publish_cluster_config`). Without one, what is up now."""
    import ray

    now = {k: float(v) for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
    try:
        grow = ray_private.max_resources_from_cluster_config()
    except Exception:  # an older Ray, or a GCS without the key's namespace: what is up now
        grow = None
    if not grow:
        return now, now, "resources up now (no autoscaler cluster config)"
    # a node type may be up beyond its max (started by hand): never less than what is up
    merged = {k: max(float(grow.get(k, 0)), now.get(k, 0.0)) for k in {*grow, *now}}
    return merged, now, "the autoscaler's node types at max_workers"


def pool_options(embedding_config: Any,
                 capacity: tuple[dict[str, float], dict[str, float], str] | None = None) -> dict[str, Any]:
    """``map_batches`` options for :class:`ChunkEmbedder`: an actor pool sized from the CPUs/GPUs the
    connected Ray cluster can grow to (:func:`cluster_capacity`,
    :func:`longrag.index.embedding.embedding_pool`), logged.

    The pool is Ray Data's autoscaling one, from 1 actor up to that size: a small build or update
    loads the model once instead of once per core, a large one grows the pool while blocks queue.
    ``embedding.concurrency`` set in the config asks for a fixed pool of that size instead. ``capacity``:
    :func:`cluster_capacity`'s answer when the caller has it (asked of the GCS otherwise)."""
    from ray.data import ActorPoolStrategy

    from longrag.index.embedding import embedding_pool

    grow, now, source = capacity or cluster_capacity()
    pool = embedding_pool(embedding_config, grow.get("CPU", 1.0) or 1.0, grow.get("GPU", 0.0))
    fixed = bool(embedding_config.concurrency)
    compute = (ActorPoolStrategy(size=pool.actors) if fixed
               else ActorPoolStrategy(min_size=1, max_size=pool.actors))
    log.info("embedding pool: %s%d actor(s) x %g CPU, %g GPU; sized from what the cluster can grow to, %g CPUs "
             "and %g GPUs (%s; up now: %g CPUs, %g GPUs)", "" if fixed else "1 up to ", pool.actors, pool.num_cpus,
             pool.num_gpus, grow.get("CPU", 0.0), grow.get("GPU", 0.0), source, now.get("CPU", 0.0),
             now.get("GPU", 0.0))
    return {
        "fn_constructor_kwargs": {"embedding_config": embedding_config.model_dump(), "torch_threads": pool.torch_threads},
        "compute": compute,
        "num_cpus": pool.num_cpus,
        "num_gpus": pool.num_gpus,
    }


def chunker_compute(embedding_config: Any) -> Any:
    """The chunking stage's actor pool beside the embedding pool: Ray Data's autoscaling pool from 1
    actor up to :func:`longrag.index.embedding.chunker_actors` of the pool the cluster can grow to."""
    from ray.data import ActorPoolStrategy

    from longrag.index.embedding import chunker_actors, embedding_pool

    grow, _, _ = cluster_capacity()
    n = chunker_actors(embedding_pool(embedding_config, grow.get("CPU", 1.0) or 1.0, grow.get("GPU", 0.0)))
    return ActorPoolStrategy(min_size=1, max_size=n)
