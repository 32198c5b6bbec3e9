"""llm.backend=serve without a cluster: what ray.serve.llm's LLMServer yields is read as the OpenAI
types (batched SSE strings, error objects), a missing application name is refused, and the Ray-free
core refuses to build it. The handle itself, against vLLM: tests/vllm/test_vllm_serve.py."""

from __future__ import annotations

import json

import pytest

from longrag.config import LLMConfig
from longrag.llm.base import ContextOverflowError, LLMError
from longrag.llm.factory import build_llm
from serve.llm_handle import ServeAppLLM, _error_message, _sse_payloads, build_engine, deployment_name


def test_batched_sse_strings_become_chunk_payloads():
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "reader",
             "choices": [{"index": 0, "delta": {"content": "Par"}, "finish_reason": None}]}
    item = [f"data: {json.dumps(chunk)}\n\n", "data: [DONE]\n\n"]
    assert [json.loads(p) for p in _sse_payloads(item)] == [chunk]
    assert _sse_payloads(f"data: {json.dumps(chunk)}\n\n".encode()) == [json.dumps(chunk)]


def test_error_responses_are_recognised_and_answers_are_not():
    assert _error_message({"error": {"message": "This model's maximum context length is 2048", "code": 400}}) \
        == "This model's maximum context length is 2048"
    assert _error_message({"object": "error", "message": "engine dead", "code": 500}) == "engine dead"
    answer = {"id": "x", "object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 3}}
    assert _error_message(answer) is None and _error_message(["not a dict"]) is None


def test_the_backend_needs_an_application_and_names_the_deployment_as_ray_serve_llm_does():
    assert deployment_name("Qwen/Qwen2.5-7B.Instruct") == "LLMServer:Qwen--Qwen2_5-7B_Instruct"
    with pytest.raises(ValueError, match="llm.serve_app"):
        build_engine(LLMConfig(backend="serve", model="reader"))
    llm = build_engine(LLMConfig(backend="serve", serve_app="reader", model="reader", context_window=4096))
    assert isinstance(llm, ServeAppLLM) and llm.deployment == "LLMServer:reader" and llm.context_window == 4096
    with pytest.raises(ValueError, match="Ray process"):
        build_llm(LLMConfig(backend="serve", serve_app="reader", model="reader"))
    with pytest.raises(ValueError, match="lora"):
        build_engine(LLMConfig(backend="serve", serve_app="reader", model="reader", lora_path="a.gguf"))


def test_a_context_overflow_from_the_engine_is_a_context_overflow_error():
    from longrag.llm.openai_http import error_class

    assert error_class("This model's maximum context length is 2048 tokens") is ContextOverflowError
    assert error_class("engine dead") is LLMError


class _Stuck:
    """A handle's response stream that never yields (vLLM still writing) and records its cancel."""

    def __init__(self, chunks: int = 0) -> None:
        self.cancelled, self.chunks = False, chunks

    def __aiter__(self):
        return self

    async def __anext__(self):
        import asyncio

        if self.chunks:
            self.chunks -= 1
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "reader",
                     "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
            return [f"data: {json.dumps(chunk)}\n\n"]
        await asyncio.sleep(3600)

    def cancel(self) -> None:
        self.cancelled = True


class _Handle:
    def __init__(self, stream: _Stuck) -> None:
        self.stream = stream

    def options(self, **_):
        return self

    @property
    def chat(self):
        return self

    def remote(self, _request):
        return self.stream


def test_a_cancelled_call_cancels_its_handle_call(monkeypatch):
    """The caller goes away (client left, deadline passed): the handle call to ray.serve.llm is cancelled
    too (a Serve response is not cancelled with the task awaiting it), so vLLM aborts the request; a
    stream whose reader stops cancels it the same way. Against vLLM's own gauge: tests/vllm. (The
    request types come from ray.serve.llm, which imports vLLM: plain dicts stand in for them here.)"""
    import asyncio
    import sys
    import types

    fake = types.ModuleType("ray.serve.llm.openai_api_models")
    fake.ChatCompletionRequest = fake.CompletionRequest = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "ray.serve.llm.openai_api_models", fake)

    async def go(stream: bool) -> _Stuck:
        llm = build_engine(LLMConfig(backend="serve", serve_app="reader", model="reader", timeout_s=600))
        stuck = _Stuck(chunks=2 if stream else 0)
        llm._handle = _Handle(stuck)
        msgs = [{"role": "user", "content": "Count to a thousand."}]
        if stream:
            gen = llm.stream_chat(msgs, max_tokens=500)
            assert await anext(gen) == "x"
            await gen.aclose()  # the reader stopped reading
        else:
            task = asyncio.create_task(llm.chat(msgs, max_tokens=500))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return stuck

    assert asyncio.run(go(stream=False)).cancelled
    assert asyncio.run(go(stream=True)).cancelled
