"""Offline token counting.

``TokenCounter`` is the small interface the grouping and chunking code needs. ``HFTokenCounter``
counts exactly with a Hugging Face ``tokenizers`` ``tokenizer.json`` (the embedding model's own
tokenizer, read from a local folder, never from the network); ``WhitespaceCounter`` is a cheap
estimate (words x factor) for places that only need an order of magnitude. Counts never include
special tokens ([CLS]/[SEP], BOS/EOS) and are never truncated. ``chars_estimate`` (characters / 4)
sizes synthetic documents, where a length must mean the same in every generator. Cutting text to
``n`` tokens: a counter's ``truncate`` (one pass, at token offsets or word ends), or
``trim_to_tokens`` for a bare count function.

These are the only token estimators of the code base: use them rather than an inline formula.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "HFTokenCounter",
    "TokenCounter",
    "WhitespaceCounter",
    "CHARS_PER_TOKEN",
    "chars_estimate",
    "counter_for_model_dir",
    "find_tokenizer_file",
    "trim_to_tokens",
]


CHARS_PER_TOKEN = 4
"""The usual rate of GPT-style BPE tokenizers on English text."""


def chars_estimate(text: str) -> int:
    """Estimated token count: ``ceil(len(text) / CHARS_PER_TOKEN)``."""
    return math.ceil(len(_check_str(text)) / CHARS_PER_TOKEN)


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens of text, without special tokens."""

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        ...

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """``[count(t) for t in texts]``, possibly faster."""
        ...


class HFTokenCounter:
    """Exact counts with a ``tokenizers.Tokenizer`` (a ``tokenizer.json`` file, a folder that holds
    one, or an already loaded ``Tokenizer``). Truncation and padding configured in the file are
    switched off on a private copy, so a count is the length of the whole text.

    ``additive`` is True for BERT-style WordPiece tokenizers, whose tokens never cross whitespace:
    the count of a text is then the sum of the counts of its whitespace-separated pieces, which
    lets the chunker skip its verification pass."""

    def __init__(self, tokenizer: str | Path | object):
        from tokenizers import Tokenizer

        if isinstance(tokenizer, (str, Path)):
            path = find_tokenizer_file(tokenizer)
            tok = Tokenizer.from_file(str(path))
            self.source = str(path)
        elif isinstance(tokenizer, Tokenizer):
            # private copy: never change the caller's truncation/padding settings
            tok = Tokenizer.from_str(tokenizer.to_str())
            self.source = "<Tokenizer>"
        else:
            raise ValueError(
                f"tokenizer must be a path to tokenizer.json, a folder holding one, or a "
                f"tokenizers.Tokenizer; got {type(tokenizer).__name__}"
            )
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        self.additive = _is_additive(tok)
        # encode_batch_fast (tokenizers >= 0.21) skips offset tracking: faster for counting
        self._batch = getattr(tok, "encode_batch_fast", tok.encode_batch)

    @property
    def tokenizer(self):
        """The underlying ``tokenizers.Tokenizer`` (truncation and padding off)."""
        return self._tok

    def count(self, text: str) -> int:
        return len(self._tok.encode(_check_str(text), add_special_tokens=False).ids)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        texts = _check_strs(texts)
        if not texts:
            return []
        return [len(e.ids) for e in self._batch(texts, add_special_tokens=False)]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return list(self._tok.encode(_check_str(text), add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character span of each token in ``text``."""
        return [tuple(o) for o in self._tok.encode(_check_str(text), add_special_tokens=False).offsets]

    def truncate(self, text: str, n: int) -> str:
        """The longest prefix of ``text`` (cut at a token end) that holds at most ``n`` tokens."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        offsets = self.token_offsets(text)
        if len(offsets) <= n:
            return text
        if n == 0:
            return ""
        return text[: offsets[n - 1][1]]

    def __repr__(self) -> str:
        return f"HFTokenCounter({self.source!r})"


_WORD_END = re.compile(r"\S+")


class WhitespaceCounter:
    """Estimate: ``ceil(words * factor)``. Words are whitespace-separated; about 1.3 subword tokens
    per English word for BERT-like vocabularies."""

    additive = False  # ceil() of a sum is not the sum of ceil()s

    def __init__(self, factor: float = 1.3):
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"factor must be a positive finite number, got {factor}")
        self.factor = float(factor)

    def count(self, text: str) -> int:
        return math.ceil(len(_check_str(text).split()) * self.factor)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        f = self.factor
        return [math.ceil(len(t.split()) * f) for t in _check_strs(texts)]

    def truncate(self, text: str, n: int) -> str:
        """The longest prefix of whole words whose estimate is at most ``n``."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        words = 0
        end = 0
        for m in _WORD_END.finditer(text):
            if math.ceil((words + 1) * self.factor) > n:
                return text[:end]
            words += 1
            end = m.end()
        return text

    def __repr__(self) -> str:
        return f"WhitespaceCounter(factor={self.factor})"



def trim_to_tokens(text: str, max_tokens: int, count_tokens: Callable[[str], int], *,
                   near: int | None = None) -> str:
    """The longest whitespace-word prefix of ``text`` with at most ``max_tokens`` tokens by
    ``count_tokens`` (binary search over word ends, so it costs O(log words) count calls).

    For a bare count function only: an LLM backend whose tokenizer gives no character offsets
    (llama.cpp's ``tokenize`` returns ids, a remote server's tokenizer is not local) has no token
    ends to cut at, so the prefix is searched (the default :meth:`longrag.llm.base.LLM.truncate_tokens`).
    A counter cuts in one pass instead (:meth:`HFTokenCounter.truncate` at token offsets,
    :meth:`WhitespaceCounter.truncate` at word ends), as a backend with a local counter does.

    ``near``: a character offset where the answer's cut probably is (where the text's
    ``max_tokens``-th token ends). The last word end at or before it is checked first, with two
    counts (it fits, the next word end does not); when that fails the search runs as without it,
    so the answer is the same either way."""
    if max_tokens <= 0:
        return ""
    if count_tokens(text) <= max_tokens:
        return text
    ends = [m.end() for m in _WORD_END.finditer(text)]
    if near is not None:
        k = bisect.bisect_right(ends, near)  # words whose end is at or before ``near``
        fits = k == 0 or count_tokens(text[: ends[k - 1]]) <= max_tokens
        if fits and (k == len(ends) or count_tokens(text[: ends[k]]) > max_tokens):
            return text[: ends[k - 1]] if k else ""
    lo, hi = 0, len(ends)  # invariant: prefix of `lo` words fits; of `hi`+1 words... search largest fitting
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(text[: ends[mid - 1]]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[: ends[lo - 1]] if lo else ""


def _is_additive(tok) -> bool:
    """WordPiece behind a BERT or whitespace pre-tokenizer and a char-local normalizer."""
    from tokenizers import models, normalizers, pre_tokenizers

    pre_ok = (pre_tokenizers.BertPreTokenizer, pre_tokenizers.Whitespace, pre_tokenizers.WhitespaceSplit)
    norm_ok = (normalizers.BertNormalizer, normalizers.Lowercase, normalizers.NFD, normalizers.StripAccents)
    return (
        isinstance(tok.model, models.WordPiece)
        and isinstance(tok.pre_tokenizer, pre_ok)
        and (tok.normalizer is None or isinstance(tok.normalizer, norm_ok))
    )


def find_tokenizer_file(path: str | Path) -> Path:
    """``path`` itself if it is a file, else the ``tokenizer.json`` in the folder (or, for
    sentence-transformers layouts, in a sub-folder such as ``0_Transformer``)."""
    p = Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        raise ValueError(f"no tokenizer at {p}: not a file or a folder")
    direct = p / "tokenizer.json"
    if direct.is_file():
        return direct
    found = sorted(p.glob("*/tokenizer.json")) + sorted(p.glob("*/*/tokenizer.json"))
    if not found:
        raise ValueError(f"no tokenizer.json in {p} or its sub-folders")
    return found[0]


def counter_for_model_dir(path: str | Path) -> HFTokenCounter:
    """An exact counter from a local model folder that holds a ``tokenizer.json``."""
    return HFTokenCounter(find_tokenizer_file(path))


def _check_str(text: str) -> str:
    if not isinstance(text, str):
        raise ValueError(f"text must be str, got {type(text).__name__}")
    return text


def _check_strs(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of str, got a single str")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"texts[{i}] must be str, got {type(t).__name__}")
    return texts
