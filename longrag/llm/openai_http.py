"""Any OpenAI-compatible server: vLLM, ``ray.serve.llm``, llama.cpp's server, hosted APIs.

Talks to ``{base_url}/chat/completions`` (and ``/completions`` for plain prompts) through the
official ``openai`` client, which retries connection errors, timeouts, 408/409/429 and 5xx answers
``max_retries`` times with exponential backoff (honouring ``Retry-After``); any other 4xx raises
:class:`LLMError` with the server's own message at once. Token counts in results come from the
response's ``usage``.

``count_tokens`` is best effort, since the server's tokenizer is not local: with ``tokenizer_file``
(a HuggingFace ``tokenizer.json``) it is exact for that tokenizer; otherwise it estimates
``ceil(words * 1.3)``, which is close for English BPE tokenizers and errs on the large side so
context fitting stays safe.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai

from longrag.llm.base import (
    LLM,
    ChatResult,
    ContextOverflowError,
    LLMError,
    check_max_tokens,
    check_messages,
    check_prompt,
    resolve_temperature,
)
from longrag.text.tokens import HFTokenCounter, WhitespaceCounter

_NO_KEY = "no-key"  # the client wants a key; without one the Authorization header is left out


estimate_tokens = WhitespaceCounter(1.3).count
"""Rough token count of English text: ``ceil(1.3 * whitespace words)`` (:class:`~longrag.text.tokens.WhitespaceCounter`)."""


def error_class(message: str) -> type[LLMError]:
    """:class:`ContextOverflowError` for a server's "prompt too long" message, else :class:`LLMError`."""
    low = message.lower()
    overflow = "context length" in low or "maximum context" in low or "too long" in low
    return ContextOverflowError if overflow else LLMError


def _server_message(exc: openai.APIStatusError) -> str:
    """The error text an OpenAI-style server put in its body (``{"error": {"message": ...}}``;
    the client has already unwrapped ``error``)."""
    body = exc.body
    if isinstance(body, dict):
        err = body.get("message", body.get("detail", body.get("error")))
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if err is not None:
            return str(err)
        return str(body)[:500]
    text = exc.response.text.strip() if exc.response is not None else ""
    return text[:500] or str(exc)


class OpenAIHTTPLLM(LLM):
    """Client of an OpenAI-compatible endpoint. ``base_url`` includes the version, e.g.
    ``http://127.0.0.1:8000/v1``."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        context_window: int = 8192,
        temperature: float = 0.0,
        seed: int | None = 0,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        tokenizer_file: str | None = None,
    ) -> None:
        if not base_url or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self._setup(base_url.rstrip("/"), model, context_window=context_window, temperature=temperature, seed=seed,
                    timeout_s=timeout_s, tokenizer_file=tokenizer_file)
        self.max_retries = int(max_retries)
        key = api_key if api_key is not None else (os.environ.get(api_key_env) if api_key_env else None)
        self._key = key or None
        # Without a key, no Authorization header at all (a local vLLM needs none).
        self._extra_headers: dict[str, Any] = {} if self._key else {"Authorization": openai.Omit()}
        self._client: openai.AsyncOpenAI | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def _setup(self, where: str, model: str, *, context_window: int, temperature: float, seed: int | None,
               timeout_s: float, tokenizer_file: str | None) -> None:
        """What every transport of the OpenAI protocol shares (this class's HTTP, a Serve handle's:
        ``serve.llm_handle``): ``where`` names the endpoint in errors."""
        if context_window <= 0:
            raise ValueError(f"context_window must be positive, got {context_window}")
        self.base_url = where
        self.name = model
        self.context_window = int(context_window)
        self.temperature = float(temperature)
        self.seed = seed
        self.timeout_s = float(timeout_s)
        self._counter: HFTokenCounter | WhitespaceCounter = WhitespaceCounter(1.3)  # = estimate_tokens
        if tokenizer_file:
            path = Path(tokenizer_file)
            if not path.is_file():
                raise ValueError(f"tokenizer_file not found: {path}")
            self._counter = HFTokenCounter(path)  # the file's truncation and padding switched off

    # -- tokens -------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        """Exact with ``tokenizer_file``, else the words x 1.3 estimate (see module doc)."""
        if not text:
            return 0
        return self._counter.count(text)

    def truncate_tokens(self, text: str, n: int) -> str:
        """In one pass with the local counter: at the tokenizer's offsets with ``tokenizer_file``
        (:meth:`HFTokenCounter.truncate`), else at the word ends of the words x 1.3 estimate."""
        return self._counter.truncate(text, n) if n > 0 else ""

    # -- HTTP ---------------------------------------------------------------------------------

    def _get_client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        # The client's connection pool is bound to the loop that opened it; tests and sync
        # wrappers may run several loops, so keep one client per loop.
        if self._client is None or self._client_loop is not loop or self._client.is_closed():
            self._client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self._key or _NO_KEY, timeout=self.timeout_s,
                max_retries=self.max_retries,
            )
            self._client_loop = loop
        return self._client

    async def _create(self, path: str, payload: dict[str, Any]) -> Any:
        """One request through the client (its retries included); its errors as :class:`LLMError`.
        Returns the ``openai`` types (``ChatCompletion``, ``Completion``; with ``stream`` an async
        iterator of ``ChatCompletionChunk``): the transport a subclass replaces."""
        url = f"{self.base_url}{path}"
        client = self._get_client()
        endpoint = client.chat.completions if path == "/chat/completions" else client.completions
        attempts = f"after {self.max_retries + 1} attempts"
        try:
            return await endpoint.create(**payload, extra_headers=self._extra_headers)
        except openai.APITimeoutError:
            raise LLMError(f"{self.name} at {url}: timed out after {self.timeout_s:g}s ({attempts})") from None
        except openai.APIConnectionError as e:
            cause = e.__cause__ or e
            raise LLMError(f"{self.name} at {url}: unreachable ({type(cause).__name__}: {cause}) ({attempts})") from e
        except openai.APIStatusError as e:
            msg = _server_message(e)
            retried = e.status_code in (408, 409, 429) or e.status_code >= 500
            cls = error_class(msg)
            raise cls(f"{self.name} at {url}: HTTP {e.status_code}: {msg}" + (f" ({attempts})" if retried else "")) from None

    def _payload(self, max_tokens: int, temperature: float | None, stop: list[str] | None) -> dict[str, Any]:
        check_max_tokens(max_tokens)
        temp = resolve_temperature(self.temperature, temperature)
        payload: dict[str, Any] = {"model": self.name, "max_tokens": max_tokens, "temperature": temp}
        if stop:
            payload["stop"] = list(stop)
        if self.seed is not None:
            payload["seed"] = self.seed
        return payload

    def _chat_payload(self, messages: list[dict], max_tokens: int, temperature: float | None,
                      stop: list[str] | None) -> dict[str, Any]:
        check_messages(messages)
        payload = self._payload(max_tokens, temperature, stop)
        payload["messages"] = [{"role": m["role"], "content": m["content"]} for m in messages]
        return payload

    def _result(self, resp: Any, text: str | None, t0: float, prompt_est: int) -> ChatResult:
        usage = getattr(resp, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None)
        text = text or ""
        return ChatResult(
            text=text,
            prompt_tokens=int(getattr(usage, "prompt_tokens", None) or prompt_est),
            completion_tokens=int(getattr(usage, "completion_tokens", None) or self.count_tokens(text)),
            cached_prompt_tokens=int(getattr(details, "cached_tokens", None) or 0),
            latency_ms=(time.perf_counter() - t0) * 1000.0,
            model=str(getattr(resp, "model", None) or self.name),
        )

    def _first_choice(self, resp: Any, path: str) -> Any:
        choices = getattr(resp, "choices", None)
        if not choices:
            raise LLMError(f"{self.base_url}{path}: response has no choices: {str(resp)[:200]}")
        return choices[0]

    async def chat(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
        cache_prefix: str | None = None,  # the server's own prefix caching sees it (vLLM)
    ) -> ChatResult:
        payload = self._chat_payload(messages, max_tokens, temperature, stop)
        t0 = time.perf_counter()
        resp = await self._create("/chat/completions", payload)
        text = self._first_choice(resp, "/chat/completions").message.content
        return self._result(resp, text, t0, self.count_message_tokens(messages))

    async def stream_chat(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
        cache_prefix: str | None = None,  # the server's own prefix caching sees it (vLLM)
    ) -> AsyncIterator[str | ChatResult]:
        """``stream=True`` with ``stream_options.include_usage`` (the last chunk carries the usage);
        retries cover opening the stream, not a stream that breaks midway (raised as LLMError)."""
        payload = self._chat_payload(messages, max_tokens, temperature, stop)
        payload.update(stream=True, stream_options={"include_usage": True})
        t0 = time.perf_counter()
        stream = await self._create("/chat/completions", payload)
        parts: list[str] = []
        last: Any = None
        try:
            async for chunk in stream:
                last = chunk if getattr(chunk, "usage", None) is not None or last is None else last
                delta = chunk.choices[0].delta.content if chunk.choices else None
                if delta:
                    parts.append(delta)
                    yield delta
        except openai.APIError as e:
            raise LLMError(f"{self.name} at {self.base_url}/chat/completions: the stream broke: {e}") from e
        yield self._result(last, "".join(parts), t0, self.count_message_tokens(messages))

    supports_json_schema = True

    async def chat_json(
        self,
        messages: list[dict],
        *,
        schema: dict[str, Any],
        max_tokens: int,
        temperature: float | None = None,
    ) -> ChatResult:
        """Chat with ``response_format`` ``json_schema`` (OpenAI structured outputs; vLLM's guided
        decoding serves the same field)."""
        check_messages(messages)
        if not isinstance(schema, dict):
            raise ValueError(f"schema must be a JSON schema dict, got {type(schema).__name__}")
        payload = self._chat_payload(messages, max_tokens, temperature, None)
        payload["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": str(schema.get("title") or "reply"), "schema": schema, "strict": True},
        }
        t0 = time.perf_counter()
        resp = await self._create("/chat/completions", payload)
        text = self._first_choice(resp, "/chat/completions").message.content
        return self._result(resp, text, t0, self.count_message_tokens(messages))

    async def complete(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> ChatResult:
        check_prompt(prompt)
        payload = self._payload(max_tokens, temperature, stop)
        payload["prompt"] = prompt
        t0 = time.perf_counter()
        resp = await self._create("/completions", payload)
        return self._result(resp, self._first_choice(resp, "/completions").text, t0, self.count_tokens(prompt))

    async def aclose(self) -> None:
        if self._client is not None and not self._client.is_closed():
            await self._client.close()
        self._client = None
