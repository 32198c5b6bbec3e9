"""Running LRGinstruction's teacher calls: the executors and the journal that makes a rerun resume.

An *executor* takes independent teacher requests and hands every reply (or error reply) to a sink as
it arrives: :func:`llm_executor` runs them in process with asyncio over one
:class:`~longrag.llm.base.LLM` (bounded concurrency, an optional rate), ``actors.teacher`` runs them
on a Ray Data pool. :func:`run_pass` puts a :class:`Journal` in front of an executor: journaled
replies with an unchanged prompt are reused, every new reply is journaled before it counts, and a
request the executor never answered becomes an error reply (counted, never lost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from longrag.journal import JsonlJournal
from longrag.llm.base import LLM, ChatResult, LLMError
from longrag.lrg import prompts as P
from longrag.lrg.records import TeacherReply, TeacherRequest
from longrag.ratelimit import AsyncRateLimiter

__all__ = ["Sink", "Executor", "Journal", "run_pass", "answer", "answer_all", "llm_executor"]

Sink = Callable[[TeacherReply], None]
Executor = Callable[[Sequence[TeacherRequest], Sink], None]
"""Runs teacher requests and hands every reply (or error reply) to the sink as it arrives."""


class Journal:
    """The teacher replies in the build's :class:`longrag.journal.JsonlJournal`: its checkpoint. A
    reply is reused only when it succeeded and its prompt fingerprint matches the request's; a torn
    last line (a crash while writing) is cut off and counted."""

    def __init__(self, path: str | Path):
        self._journal = JsonlJournal(path, parse=TeacherReply.model_validate_json)
        self.path = self._journal.path
        self.bad_lines = self._journal.bad_lines
        self.replies: dict[str, TeacherReply] = {r.id: r for r in self._journal.records if r.ok}

    def get(self, req: TeacherRequest) -> TeacherReply | None:
        r = self.replies.get(req.id)
        return r if r is not None and r.prompt_sha == req.prompt_sha else None

    def append(self, reply: TeacherReply) -> None:
        self._journal.append(reply.model_dump_json())
        if reply.ok:
            self.replies[reply.id] = reply


def run_pass(requests: Sequence[TeacherRequest], journal: Journal, executor: Executor) -> tuple[dict[str, TeacherReply], int, list[TeacherReply]]:
    """Answer ``requests``, reusing journaled replies; returns ``(replies by id, reused, errors)``.
    A request the executor never answered gets an error reply (counted, not lost)."""
    replies: dict[str, TeacherReply] = {}
    todo = []
    for r in requests:
        done = journal.get(r)
        if done is not None:
            replies[r.id] = done
        else:
            todo.append(r)
    reused = len(replies)
    wanted = {r.id: r for r in todo}
    errors: list[TeacherReply] = []

    def sink(reply: TeacherReply) -> None:
        if reply.id not in wanted:
            raise ValueError(f"executor returned a reply for an unknown request {reply.id!r}")
        journal.append(reply)
        replies[reply.id] = reply
        if not reply.ok:
            errors.append(reply)

    if todo:
        executor(todo, sink)
    for rid, req in wanted.items():
        if rid not in replies:
            missing = TeacherReply(id=rid, prompt_sha=req.prompt_sha, error="no reply from the executor")
            journal.append(missing)
            replies[rid] = missing
            errors.append(missing)
    return replies, reused, errors


# ------------------------------------------------------------------------------------------ executors


async def answer(llm: LLM, req: TeacherRequest, temperature: float | None = None) -> TeacherReply:
    """One request -> its reply; a backend error becomes the reply's ``error`` (never raised)."""
    msgs = [m.model_dump() for m in req.messages]
    try:
        if not llm.is_chat_model:
            prompt = "\n\n".join(m["content"] for m in msgs) + "\n"
            r: ChatResult = await llm.complete(prompt, max_tokens=req.max_tokens, temperature=temperature)
        elif req.json_status:
            r = await llm.chat_json(msgs, schema=P.STATUS_SCHEMA, max_tokens=req.max_tokens, temperature=temperature)
        else:
            r = await llm.chat(msgs, max_tokens=req.max_tokens, temperature=temperature)
    except (LLMError, ValueError) as e:
        return TeacherReply(id=req.id, prompt_sha=req.prompt_sha, error=f"{type(e).__name__}: {e}"[:500], model=llm.name)
    return TeacherReply(id=req.id, prompt_sha=req.prompt_sha, text=r.text, model=r.model, prompt_tokens=r.prompt_tokens,
                        completion_tokens=r.completion_tokens, latency_ms=round(r.latency_ms, 1))  # fmt: skip


async def answer_all(
    llm: LLM, requests: Sequence[TeacherRequest], *, concurrency: int = 4, qps: float | None = None,
    temperature: float | None = None, sink: Sink | None = None,
) -> list[TeacherReply]:  # fmt: skip
    """Answer ``requests`` with at most ``concurrency`` calls in flight and ``qps`` starts per second;
    each reply goes to ``sink`` as it completes. Returns the replies in request order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    sem = asyncio.Semaphore(concurrency)
    limiter = AsyncRateLimiter(qps)

    async def one(req: TeacherRequest) -> TeacherReply:
        async with sem:
            await limiter.wait()
            reply = await answer(llm, req, temperature)
        if sink is not None:
            sink(reply)
        return reply

    return list(await asyncio.gather(*(one(r) for r in requests)))


def llm_executor(llm: LLM, *, concurrency: int = 4, qps: float | None = None, temperature: float | None = None) -> Executor:
    """An in-process executor over one :class:`LLM` (tests, a single machine)."""

    def run(requests: Sequence[TeacherRequest], sink: Sink) -> None:
        asyncio.run(answer_all(llm, requests, concurrency=concurrency, qps=qps, temperature=temperature, sink=sink))

    return run
