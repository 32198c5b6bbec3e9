"""Which teacher LLM builds LRGinstruction, and the OpenAI-style request body of a teacher call.

A teacher is ``bundled`` (the default reader model in process), ``bundled:NAME`` (another bundled
GGUF model) or an OpenAI-compatible endpoint ``http(s)://host:port/v1`` (vLLM, ``ray.serve.llm``, a
hosted API) with the served model's name.
"""

from __future__ import annotations

from typing import Any

from longrag.config import LLMConfig
from longrag.lrg import prompts as P
from longrag.lrg.records import TeacherReply, TeacherRequest
from longrag.models.bundled import BUNDLED_MODELS

TEACHER_FORMS = "'bundled', 'bundled:NAME' (NAME one of {}), or an http(s):// OpenAI-compatible base URL"


def parse_teacher(spec: str, model: str | None = None, **llm: Any) -> LLMConfig:
    """``spec`` (see module doc) -> the teacher's :class:`LLMConfig`; ``llm`` sets further fields
    (context_window, max_retries, ...). Raises ValueError naming the bad value and the valid forms."""
    forms = TEACHER_FORMS.format(", ".join(sorted(BUNDLED_MODELS)))
    spec = (spec or "").strip()
    if spec == "bundled" or spec.startswith("bundled:"):
        name = spec.partition(":")[2] or LLMConfig().model
        if name not in BUNDLED_MODELS:
            raise ValueError(f"unknown bundled teacher {name!r}; valid: {forms}")
        if not BUNDLED_MODELS[name].chat:
            raise ValueError(f"bundled model {name!r} is a base model without a chat template; a teacher must chat")
        return LLMConfig(backend="llamacpp", model=name, **llm)
    if spec.startswith(("http://", "https://")):
        if not model:
            raise ValueError(f"teacher {spec!r} is an endpoint: give the served model's name (--model)")
        return LLMConfig(backend="openai", base_url=spec.rstrip("/"), model=model, **llm)
    raise ValueError(f"teacher {spec!r} is not valid; valid: {forms}")


def chat_payload(req: TeacherRequest, model: str, temperature: float, seed: int | None) -> dict[str, Any]:
    """The ``/chat/completions`` body of one request (what :class:`~longrag.llm.openai_http.OpenAIHTTPLLM`
    sends: ``response_format`` json_schema for the True/False verdicts)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [m.model_dump() for m in req.messages],
        "max_tokens": req.max_tokens,
        "temperature": temperature,
    }
    if seed is not None:
        body["seed"] = seed
    if req.json_status:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": P.STATUS_SCHEMA["title"], "schema": P.STATUS_SCHEMA, "strict": True},
        }
    return body


def reply_from_response(req_id: str, prompt_sha: str, body: Any, model: str) -> TeacherReply:
    """An OpenAI-style response body (or an error body) -> a :class:`TeacherReply`."""
    if isinstance(body, dict) and isinstance(body.get("choices"), list) and body["choices"]:
        choice = body["choices"][0] or {}
        text = (choice.get("message") or {}).get("content")
        usage = body.get("usage") or {}
        if isinstance(text, str):
            return TeacherReply(id=req_id, prompt_sha=prompt_sha, text=text, model=str(body.get("model") or model),
                                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                                completion_tokens=int(usage.get("completion_tokens") or 0))  # fmt: skip
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        err = err.get("message") or err
    return TeacherReply(id=req_id, prompt_sha=prompt_sha, error=f"bad response: {str(err)[:300]}", model=model)
