"""OpenAI-compatible HTTP backend against a real HTTP server on 127.0.0.1, plus factory and checks."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from longrag.config import LLMConfig
from longrag.llm import ChatResult, ContextOverflowError, LLMError, build_llm
from longrag.llm.base import check_messages
from longrag.llm.openai_http import OpenAIHTTPLLM, estimate_tokens


class CannedServer:
    """A tiny OpenAI-style server. Each request pops the next scripted response
    ``(status, body_dict, delay_s)``; the last one repeats. Requests are recorded."""

    def __init__(self, responses):
        self.responses = list(responses)
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body,  # header names are case-insensitive
                                        "headers": {k.lower(): v for k, v in self.headers.items()}})
                status, payload, delay = server.responses.pop(0) if len(server.responses) > 1 else server.responses[0]
                if delay:
                    time.sleep(delay)
                if isinstance(payload, list):  # a list of chunks: a server-sent event stream
                    self.send_response(status)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for item in payload:
                        self.wfile.write(f"data: {json.dumps(item)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def chat_body(text="Canberra", prompt_tokens=42, completion_tokens=3, model="served-model"):
    return {
        "id": "x",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "capital of australia?"}]


def client(url, **kw) -> OpenAIHTTPLLM:
    return OpenAIHTTPLLM(url, "served-model", **kw)


def test_chat_success_sends_openai_request(monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "sekret")
    with CannedServer([(200, chat_body(), 0)]) as srv:
        llm = client(srv.url, api_key_env="TEST_LLM_KEY", seed=5)

        async def go():
            try:
                return await llm.chat(MESSAGES, max_tokens=16, temperature=0.2, stop=["\n"])
            finally:
                await llm.aclose()

        res = asyncio.run(go())
    assert isinstance(res, ChatResult)
    assert (res.text, res.prompt_tokens, res.completion_tokens, res.model) == ("Canberra", 42, 3, "served-model")
    assert res.latency_ms > 0
    [req] = srv.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["authorization"] == "Bearer sekret"
    body = req["body"]
    assert body["model"] == "served-model" and body["messages"] == MESSAGES
    assert body["max_tokens"] == 16 and body["temperature"] == 0.2 and body["stop"] == ["\n"] and body["seed"] == 5


def test_complete_uses_completions_endpoint_and_default_temperature(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    body = {"model": "m", "choices": [{"text": " Paris"}], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
    with CannedServer([(200, body, 0)]) as srv:
        llm = client(srv.url, temperature=0.0)
        res = asyncio.run(llm.complete("The capital of France is", max_tokens=4))
    assert res.text == " Paris" and res.prompt_tokens == 7 and res.completion_tokens == 1
    [req] = srv.requests
    assert req["path"] == "/v1/completions" and req["body"]["prompt"] == "The capital of France is"
    assert req["body"]["temperature"] == 0.0 and "stop" not in req["body"]
    assert "authorization" not in req["headers"]


def test_500_then_success_is_retried():
    with CannedServer([(500, {"error": {"message": "engine hiccup"}}, 0), (200, chat_body("ok"), 0)]) as srv:
        res = asyncio.run(client(srv.url, max_retries=2).chat(MESSAGES, max_tokens=4))
    assert res.text == "ok"
    assert len(srv.requests) == 2


def test_persistent_5xx_gives_up_with_server_message():
    with CannedServer([(503, {"error": {"message": "no replicas"}}, 0)]) as srv:
        with pytest.raises(LLMError, match=r"HTTP 503: no replicas.*after 3 attempts"):
            asyncio.run(client(srv.url, max_retries=2).chat(MESSAGES, max_tokens=4))
    assert len(srv.requests) == 3


def test_400_raises_with_server_message_and_no_retry():
    err = {"error": {"message": "unknown field 'foo'", "type": "invalid_request_error"}}
    with CannedServer([(400, err, 0)]) as srv:
        with pytest.raises(LLMError, match=r"HTTP 400: unknown field 'foo'") as ei:
            asyncio.run(client(srv.url).chat(MESSAGES, max_tokens=4))
    assert not isinstance(ei.value, ContextOverflowError)
    assert len(srv.requests) == 1


def test_400_context_length_is_context_overflow():
    err = {"object": "error", "message": "This model's maximum context length is 8192 tokens. However, you requested 9000"}
    with CannedServer([(400, err, 0)]) as srv:
        with pytest.raises(ContextOverflowError, match="maximum context length is 8192"):
            asyncio.run(client(srv.url).chat(MESSAGES, max_tokens=4))


def test_timeout_is_retried_then_reported():
    with CannedServer([(200, chat_body(), 10.0)]) as srv:
        t0 = time.perf_counter()
        with pytest.raises(LLMError, match=r"timed out after 0.2s.*after 2 attempts"):
            asyncio.run(client(srv.url, timeout_s=0.2, max_retries=1).chat(MESSAGES, max_tokens=4))
        assert time.perf_counter() - t0 < 9.0  # the 10 s replies were not waited for, even on a busy machine
    assert len(srv.requests) == 2


def test_unreachable_server():
    with CannedServer([(200, chat_body(), 0)]) as srv:
        url = srv.url  # the port is free again after the server closes
    with pytest.raises(LLMError, match="unreachable"):
        asyncio.run(client(url, max_retries=1).chat(MESSAGES, max_tokens=4))


def test_missing_usage_falls_back_to_estimates():
    body = {"model": "m", "choices": [{"message": {"content": "one two three"}}]}
    with CannedServer([(200, body, 0)]) as srv:
        llm = client(srv.url)
        res = asyncio.run(llm.chat(MESSAGES, max_tokens=4))
    assert res.completion_tokens == estimate_tokens("one two three") == math.ceil(3 * 1.3)
    assert res.prompt_tokens == llm.count_message_tokens(MESSAGES)


def test_no_choices_is_an_error():
    with CannedServer([(200, {"model": "m", "choices": []}, 0)]) as srv:
        with pytest.raises(LLMError, match="no choices"):
            asyncio.run(client(srv.url).chat(MESSAGES, max_tokens=4))


def _delta(text=None, usage=None):
    body = {"id": "x", "object": "chat.completion.chunk", "model": "served-model",
            "choices": [] if text is None else [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    if usage:
        body["usage"] = usage
    return body


def test_stream_chat_yields_deltas_then_the_result():
    chunks = [_delta("Can"), _delta("ber"), _delta("ra"), _delta(usage={"prompt_tokens": 40, "completion_tokens": 3})]
    with CannedServer([(200, chunks, 0)]) as srv:
        llm = client(srv.url)

        async def go():
            return [item async for item in llm.stream_chat(MESSAGES, max_tokens=8)]

        *deltas, result = asyncio.run(go())
    assert deltas == ["Can", "ber", "ra"]
    assert isinstance(result, ChatResult) and result.text == "Canberra"
    assert (result.prompt_tokens, result.completion_tokens) == (40, 3)
    [req] = srv.requests
    assert req["body"]["stream"] is True and req["body"]["stream_options"] == {"include_usage": True}


def test_count_tokens_estimate_and_tokenizer_file(tmp_path):
    llm = OpenAIHTTPLLM("http://127.0.0.1:9/v1", "m")
    assert llm.count_tokens("") == 0
    assert llm.count_tokens("a b c d e f g h i j") == 13

    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    exact = OpenAIHTTPLLM("http://127.0.0.1:9/v1", "m", tokenizer_file=str(path))
    assert exact.count_tokens("hello world, hello!") == 5  # hello world , hello !


def test_argument_checks():
    with pytest.raises(ValueError, match="base_url"):
        OpenAIHTTPLLM("localhost:8000", "m")
    llm = OpenAIHTTPLLM("http://127.0.0.1:9/v1", "m")
    with pytest.raises(ValueError, match="max_tokens"):
        asyncio.run(llm.chat(MESSAGES, max_tokens=0))
    with pytest.raises(ValueError, match="role"):
        check_messages([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="non-empty"):
        check_messages([])


def test_factory():
    llm = build_llm(LLMConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="x", context_window=32768))
    assert isinstance(llm, OpenAIHTTPLLM) and llm.context_window == 32768 and llm.name == "x"
    with pytest.raises(ValueError, match="base_url"):
        build_llm(LLMConfig(backend="openai"))
    with pytest.raises(LLMError, match="not found"):
        build_llm(LLMConfig(backend="llamacpp", model="/nonexistent/model.gguf"))
    with pytest.raises(LLMError, match="bundled model"):
        build_llm(LLMConfig(backend="llamacpp", model="no-such-model"))


def test_llama_threads_default_to_the_cpus_held_not_half_the_machine(monkeypatch) -> None:
    """Issue 39: ``llm.n_threads=None`` left llama-cpp-python at ``cpu_count() // 2`` (one thread on 2
    cores). None now takes the CPUs a replica holds, rounded up, or every CPU the process may run on."""
    import os

    from longrag.llm import threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert threads.usable_cpus() == 4
    assert threads.resolve_threads(None) == 4  # a driver: every usable CPU
    assert threads.resolve_threads(None, 1.8) == 2  # cpu.yaml's LLMServer
    assert threads.resolve_threads(None, 1.0) == 1
    assert threads.resolve_threads(None, 0.25) == 1
    assert threads.resolve_threads(None, 16) == 4  # never more than the process may run on
    assert threads.resolve_threads(3, 1.0) == 3  # an explicit setting wins
    with pytest.raises(ValueError):
        threads.resolve_threads(0)
    with pytest.raises(ValueError):
        threads.resolve_threads(None, 0)
