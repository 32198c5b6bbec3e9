"""A llama.cpp model's vocabulary: text counted and cut in its tokens.

Apart from the engine (:mod:`longrag.llm.llamacpp`, which tokenizes through it too) because a reader
beside a remote LLM (``serve.deployments.RemoteLLM``) fits its context with the model's own counts
from the GGUF's vocabulary alone: it imports no engine code and loads no weights.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from longrag.models.bundled import resolve_model_path
from longrag.text.tokens import trim_to_tokens

__all__ = ["LlamaVocab"]

_SHARED: dict[str, LlamaVocab] = {}
_SHARED_LOCK = threading.Lock()


class LlamaVocab:
    """Text counted and cut in a llama.cpp model's tokens (no BOS, no special tokens), through a
    ``Llama`` of the model (a vocabulary-only one from :meth:`load`) under the lock its calls take.
    The token ids of the last :attr:`MEMO` texts of at least :attr:`MEMO_MIN_CHARS` are kept: a
    reader counts a unit, then may cut it, and hot units come back with the next questions."""

    MEMO = 64
    MEMO_MIN_CHARS = 2048

    def __init__(self, llama: Any, lock: threading.Lock | None = None) -> None:
        self.llama, self.lock = llama, lock or threading.Lock()
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()

    @classmethod
    def load(cls, model: str) -> LlamaVocab:
        """The GGUF's vocabulary only (no weights): a reader's fitter beside a remote LLM."""
        from llama_cpp import Llama

        return cls(Llama(model_path=str(resolve_model_path(model)), vocab_only=True, verbose=False))

    @classmethod
    def shared(cls, model: str) -> LlamaVocab:
        """One vocabulary per model file and process, loaded on first use: the readers of one
        process (the long reader, the dual stages, the long-document reader: five in the
        single-machine app's ingress) count with the same one instead of a llama context each."""
        path = str(resolve_model_path(model))
        with _SHARED_LOCK:
            vocab = _SHARED.get(path)
            if vocab is None:
                vocab = _SHARED[path] = cls.load(path)
            return vocab

    def tokenize(self, text: str) -> np.ndarray:
        with self.lock:
            ids = self._memo.get(text)
            if ids is not None:
                self._memo.move_to_end(text)
                return ids
            ids = np.asarray(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=False), dtype=np.int32)
            if len(text) >= self.MEMO_MIN_CHARS:
                self._memo[text] = ids
                if len(self._memo) > self.MEMO:
                    self._memo.popitem(last=False)
            return ids

    def __call__(self, text: str) -> int:
        return len(self.tokenize(text)) if text else 0

    def truncate(self, text: str, n: int) -> str:
        """:func:`~longrag.text.tokens.trim_to_tokens`' cut (the longest word prefix within ``n``
        tokens), checked first at the word end before the offset where the text's ``n``-th token
        ends: two counts of prefixes, where the search over a 4K-token unit's words takes a dozen."""
        if n <= 0:
            return ""
        ids = self.tokenize(text)
        if len(ids) <= n:
            return text
        with self.lock:
            head = self.llama.detokenize(ids[:n].tolist())
        near = len(text.encode("utf-8")[: len(head)].decode("utf-8", errors="ignore"))
        return trim_to_tokens(text, n, self, near=near)
