"""A llama.cpp call whose caller goes away stops (issue 44): the abort switch (libc's ``strlen`` as
llama.cpp's abort callback) read without a model, then the REAL bundled 0.5B reader cancelled
while it evaluates a long prompt, while calls wait for its lock, and while it streams; after each,
the model answers exactly as a fresh call does.

Before the fix a cancelled call's thread ran on to ``max_tokens`` with the model's lock held: each
``lock free`` bound below was missed by the whole prompt evaluation (~15 s here)."""

from __future__ import annotations

import asyncio
import ctypes
import time

import pytest

from longrag.llm.cancel import AbortSwitch, CancelToken, LLMCancelled

# ~2,800 tokens: ~15 s of prompt evaluation for the 0.5B on 2 cores, so a cancel after 1 s lands mid-prompt
LONG = " ".join(f"Sentence {i} says that the town of Alpha{i} lies on the river Beta{i}." for i in range(150))
LONG_MESSAGES = [{"role": "user", "content": LONG + "\nWrite a long essay about these towns."}]
SHORT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
FREE_WITHIN_S = 1.0  # the lock is free again this soon after a cancel (measured: 5-30 ms)


def test_cancel_token_runs_its_callbacks_once_and_at_once_when_late():
    token, seen = CancelToken(), []
    remove = token.on_cancel(lambda: seen.append("a"))
    token.on_cancel(lambda: seen.append("b"))
    remove()
    token.cancel()
    token.cancel()
    assert seen == ["b"] and token.cancelled
    token.on_cancel(lambda: seen.append("late"))
    assert seen == ["b", "late"]
    with pytest.raises(LLMCancelled):
        token.check()


def test_the_abort_callback_reads_the_flag_without_python():
    """The callback llama.cpp calls is libc's strlen over the switch's two bytes: 0 (go on) until
    tripped, 1 (abort) after, 0 again after a reset; a token bound to the switch trips it."""
    switch = AbortSwitch.__new__(AbortSwitch)  # no context: only the callback and its flag
    import llama_cpp

    from longrag.llm.cancel import _strlen_address

    switch._flag = ctypes.create_string_buffer(2)
    switch._callback = llama_cpp.ggml_abort_callback(_strlen_address())
    data = ctypes.cast(switch._flag, ctypes.c_void_p)
    assert switch._callback(data) is False and not switch.tripped
    switch.trip()
    assert switch._callback(data) is True and switch.tripped
    switch.reset()
    assert switch._callback(data) is False
    token = CancelToken()
    with switch.bound(token):
        assert not switch.tripped
        token.cancel()
        assert switch._callback(data) is True
    assert not switch.tripped  # reset after the call: the next one is not stopped by this one's cancel
    with pytest.raises(LLMCancelled), switch.bound(token):
        pass  # already cancelled: refused at the door


@pytest.fixture(scope="module")
def llm():
    from longrag.llm.llamacpp import LlamaCppLLM

    model = LlamaCppLLM("qwen2.5-coder-0.5b-instruct", n_ctx=4096)
    yield model
    model.close()


async def _lock_free_after(llm, t0: float) -> float:
    while llm._lock.locked():
        await asyncio.sleep(0.005)
    return time.perf_counter() - t0


@pytest.mark.slow
def test_a_call_cancelled_mid_prompt_stops_and_the_next_answers_as_fresh(llm):
    async def run():
        reference = (await llm.chat(SHORT, max_tokens=8)).text
        before = llm.cancel_stats()
        task = asyncio.create_task(llm.chat(LONG_MESSAGES, max_tokens=200))
        await asyncio.sleep(1.0)
        t0 = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        took = await _lock_free_after(llm, t0)
        after = llm.cancel_stats()
        again = (await llm.chat(SHORT, max_tokens=8)).text
        return reference, took, before, after, again

    reference, took, before, after, again = asyncio.run(run())
    assert took < FREE_WITHIN_S, f"the model was busy {took:.2f} s after its caller went away"
    assert after["aborted_running"] == before["aborted_running"] + 1
    assert after["requests"] == before["requests"] + 1
    assert again == reference == "Paris"


@pytest.mark.slow
def test_calls_cancelled_while_waiting_never_run(llm):
    async def run():
        before = llm.cancel_stats()
        tasks = [asyncio.create_task(llm.complete(LONG, max_tokens=50)) for _ in range(4)]
        await asyncio.sleep(1.0)  # one evaluates, three wait for the lock
        t0 = time.perf_counter()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.2)  # the waiting threads notice within their 50 ms poll
        return before, await _lock_free_after(llm, t0), llm.cancel_stats()

    before, took, after = asyncio.run(run())
    assert took < FREE_WITHIN_S
    assert after["requests"] - before["requests"] == 4
    assert after["aborted_running"] - before["aborted_running"] == 1
    assert after["refused_waiting"] - before["refused_waiting"] == 3


@pytest.mark.slow
def test_a_stream_closed_by_its_reader_stops_generating(llm):
    question = [{"role": "user", "content": "Count from 1 to 200, one number a line."}]

    async def run():
        before = llm.cancel_stats()
        stream = llm.stream_chat(question, max_tokens=400)
        deltas = 0
        async for _item in stream:
            deltas += 1
            if deltas == 5:
                break
        t0 = time.perf_counter()
        await stream.aclose()
        took = await _lock_free_after(llm, t0)
        return before, took, llm.cancel_stats(), (await llm.chat(SHORT, max_tokens=8)).text

    before, took, after, again = asyncio.run(run())
    assert took < FREE_WITHIN_S
    generated = after["generated_tokens"] - before["generated_tokens"]
    assert after["aborted_running"] == before["aborted_running"] + 1
    assert 4 <= generated < 40, generated  # stopped a few tokens after the reader did, not at max_tokens
    assert again == "Paris"


@pytest.mark.slow
def test_a_json_call_past_its_deadline_stops(llm):
    """A caller's deadline is a cancellation (asyncio.wait_for): the constrained JSON call stops too."""
    schema = {"type": "object", "properties": {"essay": {"type": "string"}}, "required": ["essay"]}

    async def run():
        t0 = time.perf_counter()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(llm.chat_json(LONG_MESSAGES, schema=schema, max_tokens=200), 1.0)
        return await _lock_free_after(llm, t0)

    assert asyncio.run(run()) < 1.0 + FREE_WITHIN_S
