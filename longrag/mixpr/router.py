"""The MixPR router: a zero-shot LLM call that says whether a query needs global retrieval
(summaries, most frequent words, whole-document descriptions -> plain PageRank) or local retrieval
(a specific question -> personalized PageRank). Prompt in our own words (Alonso and Millidge, 2024,
"Mixture-of-PageRanks: Replacing Long-Context with Real-Time, Sparse GraphRAG", Appendix A.2,
describes a y/n prompt over the first and last two chunks of the input)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Literal, Protocol

__all__ = ["Route", "ROUTER_PROMPT", "router_prompt", "parse_route", "route_query", "router_text"]

log = logging.getLogger(__name__)
_FIRST_WORD = re.compile(r"[a-z]+")

Route = Literal["local", "global"]

ROUTER_PROMPT = (
    "Decide what kind of request this is.\n"
    "Reply 'y' if it needs the whole document: a summary, the most frequent or most common words, or "
    "an overall description of the entire text.\n"
    "Reply 'n' if it asks a specific question that a few passages can answer.\n"
    "Reply with the single letter y or n and nothing else.\n\n"
    "REQUEST:\n{query}\n\n"
    "Again: 'y' for whole-document requests (summary, most frequent words, overall description), "
    "'n' for a specific question. One letter only.\n"
    "Answer:"
)


class _ChatLLM(Protocol):
    async def chat(self, messages: list[dict], *, max_tokens: int, **kwargs): ...


def router_prompt(query: str) -> str:
    """The router's user message for ``query``."""
    if not isinstance(query, str):
        raise ValueError(f"query must be str, got {type(query).__name__}")
    return ROUTER_PROMPT.format(query=query.strip())


def parse_route(reply: str, fallback: Route = "local") -> tuple[Route, bool]:
    """``(route, parsed)``: a reply whose first word is ``y``/``yes`` -> global, ``n``/``no`` ->
    local (case, quotes and punctuation ignored); anything else -> ``fallback``, ``parsed=False``."""
    if fallback not in ("local", "global"):
        raise ValueError(f"fallback must be 'local' or 'global', got {fallback!r}")
    m = _FIRST_WORD.search((reply or "").lower())
    word = m.group(0) if m else ""
    if word in ("y", "yes"):
        return "global", True
    if word in ("n", "no"):
        return "local", True
    return fallback, False


def router_text(chunk_texts: Sequence[str], n: int = 2) -> str:
    """What the router reads: the first ``n`` and last ``n`` chunks (all of them when there are at
    most ``2n``), joined by newlines with an ellipsis line between the head and the tail."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    texts = list(chunk_texts)
    if len(texts) <= 2 * n:
        return "\n".join(texts)
    return "\n".join(texts[:n] + ["..."] + texts[-n:])


async def route_query(llm: _ChatLLM, text: str, *, fallback: Route = "local", max_tokens: int = 4) -> Route:
    """Ask ``llm`` (any object with ``async chat(messages, max_tokens=...)``) whether ``text`` needs
    global ("global") or local ("local") retrieval. A reply that is not y/n gives ``fallback``."""
    result = await llm.chat([{"role": "user", "content": router_prompt(text)}], max_tokens=max_tokens)
    reply = getattr(result, "text", result)
    route, parsed = parse_route(str(reply), fallback)
    if not parsed:
        log.warning("router reply %r is neither y nor n; using fallback %r", reply, fallback)
    return route
