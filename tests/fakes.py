"""Deterministic test doubles. For unit tests only: every pipeline is also run with a real model."""

from __future__ import annotations

import copy
from typing import Callable

from longrag.llm.base import LLM, ChatResult, ContextOverflowError, check_max_tokens, check_messages

Reply = str | Callable[[list[dict]], str]


class ScriptedLLM(LLM):
    """Answers calls with scripted replies, in order, and records what it was sent.

    A reply is a string or a function of the messages. When the script runs out it repeats
    ``default``. Tokens are whitespace words, so tests can compute budgets by hand.
    """

    def __init__(
        self,
        replies: list[Reply] | None = None,
        *,
        context_window: int = 4096,
        default: str = "",
        name: str = "scripted",
        is_chat_model: bool = True,
    ) -> None:
        self.replies = list(replies or [])
        self.default = default
        self.context_window = context_window
        self.name = name
        self.is_chat_model = is_chat_model
        self.calls: list[dict] = []  # {"kind", "messages"|"prompt", "max_tokens", "temperature", "stop"}

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def count_message_tokens(self, messages: list[dict]) -> int:
        return sum(self.count_tokens(m["content"]) for m in messages)

    def _next(self, arg) -> str:
        reply = self.replies.pop(0) if self.replies else self.default
        return reply(arg) if callable(reply) else reply

    def _result(self, prompt_tokens: int, text: str, max_tokens: int) -> ChatResult:
        words = text.split(" ")
        if len(text.split()) > max_tokens:  # honour max_tokens like a real model would
            text = " ".join(words[:max_tokens])
        return ChatResult(text, prompt_tokens, self.count_tokens(text), 0.0, self.name)

    async def chat(self, messages, *, max_tokens, temperature=None, stop=None) -> ChatResult:
        check_messages(messages)
        check_max_tokens(max_tokens)
        self.calls.append(
            dict(kind="chat", messages=copy.deepcopy(messages), max_tokens=max_tokens, temperature=temperature, stop=stop)
        )
        prompt_tokens = self.count_message_tokens(messages)
        if prompt_tokens + max_tokens > self.context_window:
            raise ContextOverflowError(
                f"{prompt_tokens} + {max_tokens} tokens exceed the window of {self.context_window}"
            )
        return self._result(prompt_tokens, self._next(messages), max_tokens)

    async def complete(self, prompt, *, max_tokens, temperature=None, stop=None) -> ChatResult:
        check_max_tokens(max_tokens)
        self.calls.append(dict(kind="complete", prompt=prompt, max_tokens=max_tokens, temperature=temperature, stop=stop))
        prompt_tokens = self.count_tokens(prompt)
        if prompt_tokens + max_tokens > self.context_window:
            raise ContextOverflowError(
                f"{prompt_tokens} + {max_tokens} tokens exceed the window of {self.context_window}"
            )
        return self._result(prompt_tokens, self._next(prompt), max_tokens)
