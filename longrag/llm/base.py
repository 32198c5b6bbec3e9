"""The one LLM interface (DESIGN decision 4).

Every backend answers an async ``chat`` (a list of ``{"role", "content"}`` messages) and an async
``complete`` (a plain prompt, for base models without a chat template) with a :class:`ChatResult`
that carries the text, the real token counts and the latency; ``stream_chat`` is ``chat`` with the
text streamed as it is generated. Readers and pipelines only ever see
this interface, so a llama.cpp model in process, a vLLM server behind ``ray.serve.llm`` and a hosted
API are interchangeable.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from longrag.text.tokens import trim_to_tokens
from longrag.types import LLMError

__all__ = ["LLM", "ChatResult", "ContextOverflowError", "LLMError"]

_ROLES = frozenset({"system", "user", "assistant"})


class ContextOverflowError(LLMError):
    """The prompt (plus the requested completion) does not fit the model's context window."""


@dataclass
class ChatResult:
    """One generation: the text and what it cost."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    model: str
    #: Prompt tokens served from the backend's prefix (KV) cache instead of being evaluated again
    #: (llama.cpp: the reader's second turn repeats the first; vLLM: ``prompt_tokens_details``).
    cached_prompt_tokens: int = 0
    #: Where the state of the call's ``cache_prefix`` came from (llama.cpp's unit cache,
    #: :mod:`longrag.llm.kvcache`): "ram", "disk", "miss" (evaluated and stored), "context" (the
    #: previous call left it in the context), or "" (no prefix given, or no cache).
    prefix_cache: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_messages(messages: list[dict]) -> None:
    """Raise ValueError unless ``messages`` is a non-empty list of {role, content} dicts."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}")
        if m["role"] not in _ROLES:
            raise ValueError(f"messages[{i}] has role {m['role']!r}; expected one of {sorted(_ROLES)}")
        if not isinstance(m["content"], str):
            raise ValueError(f"messages[{i}]['content'] must be a str, got {type(m['content']).__name__}")


def check_max_tokens(max_tokens: int) -> None:
    if not isinstance(max_tokens, int) or max_tokens <= 0:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")


def check_prompt(prompt: str) -> None:
    """Raise ValueError unless ``prompt`` is a non-empty str (a plain completion's input)."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty str")


def resolve_temperature(default: float, temperature: float | None) -> float:
    """The call's temperature (``None``: the backend's configured ``default``), checked >= 0."""
    t = default if temperature is None else float(temperature)
    if t < 0:
        raise ValueError(f"temperature must be >= 0, got {t}")
    return t


class LLM(abc.ABC):
    """Abstract async LLM. Subclasses set ``name``, ``context_window`` (tokens) and, for base
    models, ``is_chat_model = False``."""

    name: str
    context_window: int
    #: False for base models without a chat template: callers then build plain prompts and use
    #: :meth:`complete` (the long reader does this by itself).
    is_chat_model: bool = True
    #: True where :meth:`chat_json` constrains decoding to the JSON schema (llama.cpp grammar,
    #: OpenAI ``response_format``); False: the default asks in the prompt only.
    supports_json_schema: bool = False
    #: True: every call is evaluated from scratch, as after :meth:`forget_prefixes` (benchmarks
    #: comparing prompts: within one pipeline the reader's prompt would otherwise reuse the router's
    #: cached prefix, and its logits could differ from a cold read's in the last bits).
    cold_reads: bool = False

    @abc.abstractmethod
    async def chat(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
        cache_prefix: str | None = None,
    ) -> ChatResult:
        """Answer a conversation with the model's chat template. ``temperature=None`` takes the
        backend's configured default. ``cache_prefix``: a text the last user message starts with
        (the reader's documents' top unit) whose KV state a backend may keep for later prompts that
        open the same way; a hint, backends without such a store ignore it."""

    @abc.abstractmethod
    async def complete(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> ChatResult:
        """Continue a plain text prompt (no chat template): for base models."""

    async def stream_chat(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
        cache_prefix: str | None = None,
    ) -> AsyncIterator[str | ChatResult]:
        """:meth:`chat`, streamed: yields the reply's text deltas as they are generated, then one
        :class:`ChatResult` for the whole reply (its ``text`` is the deltas joined). Backends that
        stream override this (llama.cpp ``stream=True``, OpenAI ``stream``); this default yields
        the whole reply as one delta."""
        res = await self.chat(messages, max_tokens=max_tokens, temperature=temperature, stop=stop,
                              cache_prefix=cache_prefix)
        if res.text:
            yield res.text
        yield res

    async def chat_json(
        self,
        messages: list[dict],
        *,
        schema: dict[str, Any],
        max_tokens: int,
        temperature: float | None = None,
    ) -> ChatResult:
        """A chat whose reply should be one JSON object matching ``schema``. Backends that can
        constrain decoding override this and set ``supports_json_schema``; this default is a plain
        :meth:`chat`, so callers parse the reply defensively either way."""
        return await self.chat(messages, max_tokens=max_tokens, temperature=temperature)

    @abc.abstractmethod
    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` takes in this model (exact where the backend has the tokenizer)."""

    def truncate_tokens(self, text: str, n: int) -> str:
        """The longest prefix of ``text`` that takes at most ``n`` tokens in this model (``""`` for
        ``n <= 0``). Default: a binary search over word ends with :meth:`count_tokens`
        (:func:`longrag.text.tokens.trim_to_tokens`), for backends whose tokenizer gives no character
        offsets (llama.cpp, a remote deployment); a backend with a local counter cuts in one pass."""
        return trim_to_tokens(text, n, self.count_tokens)

    def count_message_tokens(self, messages: list[dict]) -> int:
        """Approximate prompt size of a conversation: content tokens plus a few per message for
        the template's role markers."""
        return sum(self.count_tokens(m["content"]) + 4 for m in messages) + 2

    def forget_prefixes(self) -> None:
        """Drop what the backend keeps of earlier prompts, so the next call is evaluated from
        scratch. Benchmarks use it: a prompt evaluated again from a cached prefix can give logits that
        differ in the last bits, hence now and then another greedy answer, which would make one row
        depend on the row read before it. Default: nothing kept here (a server's cache is its own)."""

    async def aclose(self) -> None:
        """Release resources (HTTP clients, model memory). Default: nothing to release."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, context_window={self.context_window})"
