"""Chunks tokenized apart from the encoder: the CPU half of a GPU embedding pool.

:meth:`longrag.index.embedding.Embedder.encode_passages` tokenizes in the thread that runs the model.
On a CPU that costs nothing (the model dominates); on a GPU it bounds the build: on an H200, MiniLM
embedded 1,250 chunks/s so, where the model alone runs 28,600 (docs/benchmarks.md, "Feeding the
GPU"). :class:`PassageTokenizer` is the encoder's tokenization without its weights — the model's
prompt prepended (the text stripped and lower-cased where the installed sentence-transformers does
so), truncated to the model's input limit with the special tokens — so a CPU stage of the build
(``actors.embedding.ChunkTokenizer``) turns chunks into token ids and the GPU actors only pad them
(:meth:`PassageTokenizer.pad`, length-bucketed by the stage's sort) and run the model
(:meth:`~longrag.index.embedding.Embedder.encode_features`). The vectors equal ``encode_passages``'s
(tests/longrag/test_tokenized.py, against sentence-transformers' own tokenization and ``encode``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from longrag.config import EmbeddingConfig

PAD_MULTIPLE = 8
"""Padded lengths are rounded up to a multiple of this (tensor-core tiles on a GPU; masked, so the
vectors do not change)."""

TOKENIZERS_PER_GPU = 12
"""Tokenizing actors the build grows to per GPU embedding actor. Measured on an H200 host (16 cores,
MiniLM, 255-token chunks; docs/benchmarks.md, "Feeding the GPU"): one core tokenizes ~2,000 chunks/s,
the model alone runs ~28,600; fed by 8 tokenizing processes 10,300 chunks/s, by 12 13,300 (by 15 no
more: the host's cores are shared with the model's process)."""


def transformer_settings(folder: str | Path) -> dict[str, Any]:
    """The ``sentence_bert_config.json`` of a sentence-transformers folder's Transformer module
    (``max_seq_length``, ``do_lower_case``); empty when the folder has none."""
    root = Path(folder).expanduser()
    for candidate in (root / "sentence_bert_config.json", root / "0_Transformer" / "sentence_bert_config.json"):
        try:
            return dict(json.loads(candidate.read_text()))
        except (OSError, ValueError):
            continue
    return {}


def _sentence_transformers_major() -> int:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("sentence-transformers").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 6


class PassageTokenizer:
    """The encoder's tokenizer for passages (``role="passage"``: the document prompt) or queries (the query
    prompt), loaded from the model's folder without its weights.

    :meth:`token_ids` gives each text's ids (special tokens included, truncated to the model's input
    limit); :meth:`pad` stacks a batch of them into the arrays the model takes; :meth:`batches` does
    both over many texts, length-bucketed (texts sorted by length, so a batch pads little)."""

    def __init__(self, config: EmbeddingConfig | None = None, *, role: Literal["passage", "query"] = "passage") -> None:
        from longrag.index.embedding import embedding_prompts, resolve_embedding_model, tokenizer_dir

        self.config = config or EmbeddingConfig()
        spec = resolve_embedding_model(self.config.model)
        folder = tokenizer_dir(spec)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        settings = transformer_settings(spec.path_or_name) or transformer_settings(folder)
        limit = self.config.max_seq_length or spec.max_seq_length or settings.get("max_seq_length")
        self.max_seq_length = int(limit or self.tokenizer.model_max_length)
        self.lower_case = bool(settings.get("do_lower_case", False))
        # sentence-transformers before 6 stripped each text (prompt included) before tokenizing; 6 does not
        self.strip = _sentence_transformers_major() < 6
        query, document = embedding_prompts(self.config, spec)
        self.prompt = document if role == "passage" else query
        self.input_names = tuple(n for n in self.tokenizer.model_input_names
                                 if n in ("input_ids", "token_type_ids", "attention_mask"))
        # the Rust tokenizer alone where there is one (~1.2x transformers' call: no offsets, no Python lists)
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        self._rust: Any = None
        if backend is not None:
            from tokenizers import Tokenizer

            self._rust = Tokenizer.from_str(backend.to_str())
            self._rust.no_padding()
            self._rust.enable_truncation(self.max_seq_length, strategy="longest_first",
                                         direction=self.tokenizer.truncation_side)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self.left_padding = self.tokenizer.padding_side == "left"

    SETTINGS = "tokenizer_settings.json"

    def save(self, folder: str | Path) -> None:
        """This tokenizer as files that :meth:`load` reads without transformers (or torch): ``tokenizer.json``,
        the Rust tokenizer as transformers set it up (special tokens, truncation at the input limit), and
        ``tokenizer_settings.json`` (padding, lower-casing, stripping, both roles' prompts)."""
        if self._rust is None:
            raise ValueError("only a fast (Rust) tokenizer can be saved for use without transformers")
        from longrag.index.embedding import embedding_prompts, resolve_embedding_model

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tokenizer.json").write_text(self._rust.to_str())
        query, document = embedding_prompts(self.config, resolve_embedding_model(self.config.model))
        settings = {"max_seq_length": self.max_seq_length, "lower_case": self.lower_case, "strip": self.strip,
                    "input_names": list(self.input_names), "pad_id": self.pad_id, "left_padding": self.left_padding,
                    "prompts": {"query": query, "passage": document}}
        (folder / self.SETTINGS).write_text(json.dumps(settings, indent=1))

    @classmethod
    def load(cls, folder: str | Path, config: EmbeddingConfig, *,
             role: Literal["passage", "query"] = "passage") -> PassageTokenizer:
        """What :meth:`save` wrote, with the ``tokenizers`` package alone."""
        from tokenizers import Tokenizer

        folder = Path(folder)
        settings = json.loads((folder / cls.SETTINGS).read_text())
        self = cls.__new__(cls)
        self.config, self.tokenizer = config, None
        self.max_seq_length, self.lower_case = int(settings["max_seq_length"]), bool(settings["lower_case"])
        self.strip, self.input_names = bool(settings["strip"]), tuple(settings["input_names"])
        self.pad_id, self.left_padding = int(settings["pad_id"]), bool(settings["left_padding"])
        self.prompt = settings["prompts"][role]
        self._rust = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return self

    def token_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's token ids (int32), as the encoder would see them."""
        texts = [self.prompt + str(t) for t in texts]
        if self.strip:
            texts = [t.strip() for t in texts]
        if self.lower_case:
            texts = [t.lower() for t in texts]
        if not texts:
            return []
        if self._rust is not None:
            encode = getattr(self._rust, "encode_batch_fast", self._rust.encode_batch)  # _fast: tokenizers >= 0.21
            return [np.array(e.ids, dtype=np.int32) for e in encode(texts)]
        enc = self.tokenizer(texts, truncation="longest_first", max_length=self.max_seq_length,
                             padding=False, return_attention_mask=False, return_token_type_ids=False, verbose=False)
        return [np.asarray(ids, dtype=np.int32) for ids in enc["input_ids"]]

    def pad(self, ids: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """A batch of id arrays -> the model's inputs (int64 ``input_ids``, ``attention_mask`` and, where the
        tokenizer has them, all-zero ``token_type_ids``), padded to the longest rounded up to
        :data:`PAD_MULTIPLE`, on the tokenizer's padding side."""
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        width = int(-(-max(int(lengths.max(initial=1)), 1) // PAD_MULTIPLE) * PAD_MULTIPLE)
        input_ids = np.full((len(ids), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(ids), width), dtype=np.int64)
        for row, (x, n) in enumerate(zip(ids, lengths)):
            cols = slice(width - n, width) if self.left_padding else slice(0, n)
            input_ids[row, cols] = x
            mask[row, cols] = 1
        out = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            out["token_type_ids"] = np.zeros_like(input_ids)
        return out

    def batches(self, texts: Sequence[str], batch_size: int) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """``(rows, inputs)`` per batch of ``batch_size`` texts in order of length: ``rows`` are the texts'
        positions in ``texts``."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        ids = self.token_ids(texts)
        for rows in bucketed(ids, batch_size):
            yield rows, self.pad([ids[i] for i in rows])

    def __repr__(self) -> str:
        return (f"PassageTokenizer(max_seq_length={self.max_seq_length}, prompt={self.prompt!r}, "
                f"lower_case={self.lower_case}, inputs={self.input_names})")


_WORKER: PassageTokenizer | None = None


def _start_worker(config_json: str, role: Literal["passage", "query"]) -> None:
    global _WORKER
    _WORKER = PassageTokenizer(EmbeddingConfig.model_validate_json(config_json), role=role)


def _tokenize_block(job: tuple[int, list[str]]) -> tuple[int, list[np.ndarray]]:
    assert _WORKER is not None, "a TokenizerPool worker without its tokenizer"
    return job[0], _WORKER.token_ids(job[1])


def _ready(_: int) -> bool:
    import time

    time.sleep(0.05)  # long enough for every worker to take one
    return _WORKER is not None


class TokenizerPool:
    """:class:`PassageTokenizer` in ``processes`` worker processes: the build's tokenizing stage without Ray,
    for a machine that runs the model in one process (``jobs.gpu_check`` measures the GPU fed so).
    :meth:`blocks` yields ``(first row, ids)`` per block of texts as the workers finish them."""

    def __init__(self, config: EmbeddingConfig, processes: int, *, role: Literal["passage", "query"] = "passage") -> None:
        import multiprocessing

        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker, as one CPU per actor
        self.processes = processes
        # spawn: the parent may hold a CUDA context, which a forked child must not inherit
        self._pool = multiprocessing.get_context("spawn").Pool(
            processes, initializer=_start_worker, initargs=(config.model_dump_json(), role))
        if not all(self._pool.map(_ready, range(processes * 2), chunksize=1)):
            raise RuntimeError("a tokenizer worker started without its tokenizer")

    def blocks(self, texts: Sequence[str], block: int = 1024) -> Iterator[tuple[int, list[np.ndarray]]]:
        jobs = ((lo, [str(t) for t in texts[lo:lo + block]]) for lo in range(0, len(texts), block))
        yield from self._pool.imap_unordered(_tokenize_block, jobs)

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()

    def __enter__(self) -> TokenizerPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def length_order(ids: Sequence[np.ndarray]) -> np.ndarray:
    """Positions in ``ids`` from the shortest to the longest (stable)."""
    return np.argsort(np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids)), kind="stable")


def bucketed(ids: Sequence[np.ndarray], batch_size: int) -> Iterator[np.ndarray]:
    """Positions in ``ids`` in batches of ``batch_size``, ordered by length (what the tokenizing stage's sort
    gives the pool): each batch pads to lengths close to its own."""
    order = length_order(ids)
    for lo in range(0, len(order), batch_size):
        yield order[lo:lo + batch_size]
