"""``llm.backend=serve``: the OpenAI protocol to a ``ray.serve.llm`` application over a Serve
deployment handle, not over HTTP.

The GPU configs (serve/configs/gpu.yaml, cluster/kuberay/rayservice.yaml) deploy the vLLM reader as
an application without a route (``serve.llm_app:build_private_app``): the only thing the public
proxy serves is the LongRAG app, whose API keys, rate limits and body caps guard every request, and
the GPUs answer only calls from inside the cluster. :class:`ServeAppLLM` sends the same requests the
``openai`` backend sends (``ChatCompletionRequest`` of ``ray.serve.llm.openai_api_models``) to the
application's ``LLMServer`` deployment and reads its answers as the ``openai`` package's types, so
everything above the transport (payloads, usage, JSON-constrained output, streaming with the usage
last) is :class:`longrag.llm.openai_http.OpenAIHTTPLLM`'s own code.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from longrag.config import LLMConfig
from longrag.llm.base import LLM, LLMError
from longrag.llm.openai_http import OpenAIHTTPLLM, error_class

__all__ = ["ServeAppLLM", "build_engine", "deployment_name"]


def deployment_name(model_id: str) -> str:
    """The name ``ray.serve.llm.build_llm_deployment`` gives a model's ``LLMServer`` deployment."""
    return "LLMServer:" + model_id.replace("/", "--").replace(".", "_")


def _error_message(obj: Any) -> str | None:
    """The message of a ``ray.serve.llm`` ``ErrorResponse`` (an object or its SSE JSON), else None."""
    data = obj.model_dump() if hasattr(obj, "model_dump") else obj
    if not isinstance(data, dict):
        return None
    err = data.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err)
    if data.get("object") == "error" or (set(data) >= {"message", "code"} and "choices" not in data):
        return str(data.get("message"))
    return None


def _sse_payloads(item: Any) -> list[str]:
    """The JSON payloads of one streamed item: ``ray.serve.llm`` batches chunks as lists of SSE
    strings (``data: {...}\\n\\n``)."""
    items = item if isinstance(item, list) else [item]
    out = []
    for part in items:
        text = part.decode() if isinstance(part, bytes) else str(part)
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                out.append(line[5:].strip())
    return out


class ServeAppLLM(OpenAIHTTPLLM):
    """:class:`OpenAIHTTPLLM` whose transport is a handle to ``app``'s ``deployment``."""

    def __init__(self, app: str, model: str, *, deployment: str | None = None, context_window: int = 8192,
                 temperature: float = 0.0, seed: int | None = 0, timeout_s: float = 120.0,
                 tokenizer_file: str | None = None) -> None:
        if not app:
            raise ValueError("llm.backend=serve needs llm.serve_app: the ray.serve.llm application's name")
        self.app, self.deployment = app, deployment or deployment_name(model)
        self._setup(f"serve app {app!r} ({self.deployment})", model, context_window=context_window,
                    temperature=temperature, seed=seed, timeout_s=timeout_s, tokenizer_file=tokenizer_file)
        self._handle: Any = None

    def _get_handle(self) -> Any:
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_deployment_handle(self.deployment, app_name=self.app)
        return self._handle.options(stream=True)

    async def _create(self, path: str, payload: dict[str, Any]) -> Any:
        from openai.types import Completion
        from openai.types.chat import ChatCompletion, ChatCompletionChunk
        from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

        chat = path == "/chat/completions"
        request = (ChatCompletionRequest if chat else CompletionRequest)(**payload)
        method = "chat" if chat else "completions"
        try:
            stream = getattr(self._get_handle(), method).remote(request)
        except Exception as exc:  # noqa: BLE001 - no such application/deployment
            raise LLMError(f"{self.name} at {self.base_url}: unreachable ({type(exc).__name__}: {exc})") from exc
        if payload.get("stream"):
            return self._chunks(stream, ChatCompletionChunk)
        try:
            first = await asyncio.wait_for(anext(stream), self.timeout_s)
        except asyncio.CancelledError:
            # The caller went away (its client left, its deadline passed): a handle call is not cancelled
            # with the task awaiting it, so cancel it here and vLLM aborts the request.
            stream.cancel()
            raise
        except TimeoutError:
            stream.cancel()
            raise LLMError(f"{self.name} at {self.base_url}: timed out after {self.timeout_s:g}s") from None
        except StopAsyncIteration:
            raise LLMError(f"{self.name} at {self.base_url}: no response") from None
        except Exception as exc:  # noqa: BLE001 - the replica died, the engine failed
            raise LLMError(f"{self.name} at {self.base_url}: {type(exc).__name__}: {exc}") from exc
        first = first[0] if isinstance(first, list) and first else first
        message = _error_message(first)
        if message is not None:
            raise error_class(message)(f"{self.name} at {self.base_url}: {message}")
        data = first.model_dump() if hasattr(first, "model_dump") else first
        return (ChatCompletion if chat else Completion).model_validate(data)

    async def _chunks(self, stream: Any, chunk_type: Any) -> AsyncIterator[Any]:
        ended = False
        try:
            async for item in stream:
                for raw in _sse_payloads(item):
                    data = json.loads(raw)
                    message = _error_message(data)
                    if message is not None:
                        raise error_class(message)(f"{self.name} at {self.base_url}: {message}")
                    yield chunk_type.model_validate(data)
            ended = True
        except LLMError:
            raise
        except Exception as exc:  # noqa: BLE001 - the stream broke midway
            raise LLMError(f"{self.name} at {self.base_url}: the stream broke: {type(exc).__name__}: {exc}") from exc
        finally:
            if not ended:  # the reader stopped reading (cancelled, closed, or an error): vLLM stops writing
                stream.cancel()

    async def aclose(self) -> None:
        self._handle = None


def build_engine(config: LLMConfig) -> LLM:
    """The LLM of ``config`` inside a Ray process: ``llm.backend=serve`` here, the others by
    :func:`longrag.llm.factory.build_llm`."""
    if config.backend != "serve":
        from longrag.llm.factory import build_llm

        return build_llm(config)
    if config.lora_path:
        raise ValueError("llm.lora_path applies to the llamacpp backend only; with llm.backend=serve give the "
                         "ray.serve.llm application a lora_config and set llm.model to the adapter's name")
    return ServeAppLLM(config.serve_app or "", config.model, deployment=config.serve_deployment,
                       context_window=config.context_window, temperature=config.temperature, seed=config.seed,
                       timeout_s=config.timeout_s, tokenizer_file=config.tokenizer_file)
