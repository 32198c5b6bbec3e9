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
