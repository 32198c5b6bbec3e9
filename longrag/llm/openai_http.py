"""Any OpenAI-compatible server over HTTP: vLLM, ``ray.serve.llm``, llama.cpp's server, hosted APIs.

POSTs ``{base_url}/chat/completions`` (and ``/completions`` for plain prompts) with ``httpx``.
Connection errors, timeouts, 429 and 5xx answers are retried a few times with exponential backoff;
any other 4xx raises :class:`LLMError` with the server's own message. Token counts in results come
from the response's ``usage``.

``count_tokens`` is best effort, since the server's tokenizer is not local: with ``tokenizer_file``
(a HuggingFace ``tokenizer.json``) it is exact for that tokenizer; otherwise it estimates
``ceil(words * 1.3)``, which is close for English BPE tokenizers and errs on the large side so
context fitting stays safe.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from pathlib import Path
from typing import Any

import httpx

from longrag.llm.base import (
    LLM,
    ChatResult,
    ContextOverflowError,
    LLMError,
    check_max_tokens,
    check_messages,
)

WORDS_TO_TOKENS = 1.3
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def estimate_tokens(text: str) -> int:
    """Rough token count of English text: ``ceil(1.3 * whitespace words)``."""
    n = len(text.split())
    return math.ceil(n * WORDS_TO_TOKENS)


def _server_message(resp: httpx.Response) -> str:
    """The error text an OpenAI-style server put in its body (``{"error": {"message": ...}}``)."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:500] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if err is not None:
            return str(err)
    return str(body)[:500]


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
        backoff_s: float = 0.5,
        tokenizer_file: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not base_url or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if context_window <= 0:
            raise ValueError(f"context_window must be positive, got {context_window}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.name = model
        self.context_window = int(context_window)
        self.temperature = float(temperature)
        self.seed = seed
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        key = api_key if api_key is not None else (os.environ.get(api_key_env) if api_key_env else None)
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._headers = headers
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._tokenizer = None
        if tokenizer_file:
            from tokenizers import Tokenizer

            path = Path(tokenizer_file)
            if not path.is_file():
                raise ValueError(f"tokenizer_file not found: {path}")
            self._tokenizer = Tokenizer.from_file(str(path))

    # -- tokens -------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        """Exact with ``tokenizer_file``, else the words x 1.3 estimate (see module doc)."""
        if not text:
            return 0
        if self._tokenizer is not None:
            return len(self._tokenizer.encode(text, add_special_tokens=False).ids)
        return estimate_tokens(text)

    # -- HTTP ---------------------------------------------------------------------------------

    def _get_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        # An AsyncClient is bound to the loop that opened its connections; tests and sync
        # wrappers may run several loops, so keep one client per loop.
        if self._client is None or self._client_loop is not loop or self._client.is_closed:
            self._client = httpx.AsyncClient(
                headers=self._headers,
                timeout=httpx.Timeout(self.timeout_s),
                transport=self._transport,
            )
            self._client_loop = loop
        return self._client

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}{path}"
        client = self._get_client()
        last: str = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * (2 ** (attempt - 1)))
            try:
                resp = await client.post(url, json=payload)
            except httpx.TimeoutException as e:
                last = f"timed out after {self.timeout_s:g}s ({type(e).__name__})"
                continue
            except httpx.TransportError as e:
                last = f"unreachable ({type(e).__name__}: {e})"
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {_server_message(resp)}"
                continue
            if resp.status_code >= 400:
                msg = _server_message(resp)
                low = msg.lower()
                cls = (
                    ContextOverflowError
                    if "context length" in low or "maximum context" in low or "too long" in low
                    else LLMError
                )
                raise cls(f"{self.name} at {url}: HTTP {resp.status_code}: {msg}")
            try:
                return resp.json()
            except ValueError as e:
                raise LLMError(f"{self.name} at {url}: response is not JSON: {resp.text[:200]!r}") from e
        raise LLMError(f"{self.name} at {url}: {last} (after {self.max_retries + 1} attempts)")

    def _payload(self, max_tokens: int, temperature: float | None, stop: list[str] | None) -> dict[str, Any]:
        check_max_tokens(max_tokens)
        temp = self.temperature if temperature is None else float(temperature)
        if temp < 0:
            raise ValueError(f"temperature must be >= 0, got {temp}")
        payload: dict[str, Any] = {"model": self.name, "max_tokens": max_tokens, "temperature": temp}
        if stop:
            payload["stop"] = list(stop)
        if self.seed is not None:
            payload["seed"] = self.seed
        return payload

    def _result(self, body: dict[str, Any], text: str | None, t0: float, prompt_est: int) -> ChatResult:
        usage = body.get("usage") or {}
        text = text or ""
        return ChatResult(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens") or prompt_est),
            completion_tokens=int(usage.get("completion_tokens") or self.count_tokens(text)),
            cached_prompt_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
            latency_ms=(time.perf_counter() - t0) * 1000.0,
            model=str(body.get("model") or self.name),
        )

    @staticmethod
    def _first_choice(body: dict[str, Any], url: str) -> dict[str, Any]:
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise LLMError(f"{url}: response has no choices: {str(body)[:200]}")
        return choices[0]

    async def chat(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> ChatResult:
        check_messages(messages)
        payload = self._payload(max_tokens, temperature, stop)
        payload["messages"] = [{"role": m["role"], "content": m["content"]} for m in messages]
        t0 = time.perf_counter()
        body = await self._post("/chat/completions", payload)
        choice = self._first_choice(body, self.base_url + "/chat/completions")
        text = (choice.get("message") or {}).get("content")
        return self._result(body, text, t0, self.count_message_tokens(messages))

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
        payload = self._payload(max_tokens, temperature, None)
        payload["messages"] = [{"role": m["role"], "content": m["content"]} for m in messages]
        payload["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": str(schema.get("title") or "reply"), "schema": schema, "strict": True},
        }
        t0 = time.perf_counter()
        body = await self._post("/chat/completions", payload)
        choice = self._first_choice(body, self.base_url + "/chat/completions")
        text = (choice.get("message") or {}).get("content")
        return self._result(body, text, t0, self.count_message_tokens(messages))

    async def complete(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> ChatResult:
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty str")
        payload = self._payload(max_tokens, temperature, stop)
        payload["prompt"] = prompt
        t0 = time.perf_counter()
        body = await self._post("/completions", payload)
        choice = self._first_choice(body, self.base_url + "/completions")
        return self._result(body, choice.get("text"), t0, self.count_tokens(prompt))

    async def aclose(self) -> None:
        if self._client is not None and not self._client.is_closed:
            await self._client.aclose()
        self._client = None
