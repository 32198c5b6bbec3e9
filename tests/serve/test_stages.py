"""serve.stages: which failures are the request's (InvalidRequest: 4xx, never retried) and which the
server's (anything else, a plain ValueError included: retried once, then 503); deadlines. No Ray:
part of `make test-fast`."""

from __future__ import annotations

import asyncio

import pytest

from longrag.types import InvalidRequest
from serve import stages


class _Wrapped(Exception):
    """What Ray raises for a deployment call that raised: the user exception as ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"ray task error\n{cause}")
        self.cause = cause


def _calls(*outcomes):
    """An async call that raises or returns the next outcome, and the list of calls made."""
    made: list[int] = []

    async def call():
        made.append(1)
        out = outcomes[min(len(made), len(outcomes)) - 1]
        if isinstance(out, BaseException):
            raise out
        return out

    return call, made


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("exc", [InvalidRequest("k must be a positive int"),
                                 _Wrapped(InvalidRequest("unknown strategy 'X'"))])
def test_an_invalid_request_is_the_callers_and_is_not_retried(exc):
    call, made = _calls(exc)
    with pytest.raises(Exception) as info:
        run(stages.run_stage("dual", 5.0, call))
    assert stages.is_client_error(info.value) and len(made) == 1


@pytest.mark.parametrize("exc", [ValueError("encoder returned shape (3, 8), expected (3, 384)"),
                                 _Wrapped(ValueError("the generator stage has no model: set dual.generator_llm")),
                                 UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")])
def test_any_other_error_is_the_servers_retried_once_then_503(exc):
    call, made = _calls(exc)
    with pytest.raises(stages.StageFailed) as info:
        run(stages.run_stage("retrieve", 5.0, call))
    assert info.value.status == 503 and len(made) == 2
    assert not stages.is_client_error(exc)


def test_a_failure_then_a_success_answers_and_counts_the_retry():
    call, made = _calls(RuntimeError("replica died"), "ok")
    trace: dict = {}
    assert run(stages.run_stage("read", 5.0, call, trace=trace)) == "ok"
    assert len(made) == 2 and trace == {"read_retries": 1}


def test_a_stage_past_its_deadline_is_a_504_naming_it():
    async def slow():
        await asyncio.sleep(1.0)

    with pytest.raises(stages.StageTimeout) as info:
        run(stages.run_stage("encode", 0.05, slow))
    assert info.value.status == 504 and info.value.detail["stage"] == "encode"


def test_a_failure_then_the_deadline_is_a_503_naming_both():
    made: list[int] = []

    async def fail_then_hang():
        made.append(1)
        if len(made) == 1:
            raise RuntimeError("replica died")
        await asyncio.sleep(5.0)

    with pytest.raises(stages.StageFailed) as info:
        run(stages.run_stage("read", 0.2, fail_then_hang))
    assert info.value.status == 503 and len(made) == 2
    assert "did not answer within 0.2 s" in info.value.message and "replica died" in info.value.message


class _Stream:
    """An async iterator over ``items`` (an exception among them is raised there); counts closes."""

    def __init__(self, items, closed: list[int], delay: float = 0.0) -> None:
        self.items, self.closed, self.delay = list(items), closed, delay

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(self.delay)
        if not self.items:
            raise StopAsyncIteration
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    async def aclose(self) -> None:
        self.closed.append(1)


def _collect(stream_stage) -> tuple[list, BaseException | None]:
    async def go():
        got = []
        try:
            async for item in stream_stage:
                got.append(item)
        except Exception as exc:  # noqa: BLE001 - returned for the test to look at
            return got, exc
        return got, None

    return run(go())


def test_a_stream_that_fails_before_its_first_item_is_opened_again():
    closed: list[int] = []
    streams = iter([_Stream([RuntimeError("replica died")], closed), _Stream(["a", "b"], closed)])
    trace: dict = {}
    got, err = _collect(stages.stream_stage("read", 5.0, lambda: next(streams), trace=trace))
    assert (got, err, trace) == (["a", "b"], None, {"read_retries": 1})
    assert closed == [1]  # the failed stream was stopped; the finished one needs no close


def test_a_stream_that_fails_after_an_item_ends_with_a_503_and_is_not_retried():
    closed: list[int] = []
    opened: list[int] = []

    def open_():
        opened.append(1)
        return _Stream(["a", RuntimeError("replica died")], closed)

    got, err = _collect(stages.stream_stage("read", 5.0, open_))
    assert got == ["a"] and isinstance(err, stages.StageFailed) and err.status == 503
    assert "after the answer had started streaming" in err.message and opened == [1] and closed == [1]


def test_a_stream_past_its_deadline_is_a_504_and_a_refused_one_is_the_callers():
    closed: list[int] = []
    got, err = _collect(stages.stream_stage("read", 0.2, lambda: _Stream(["a", "b", "c"], closed, delay=0.08)))
    assert got == ["a", "b"] and isinstance(err, stages.StageTimeout) and closed == [1]
    got, err = _collect(stages.stream_stage("read", 5.0, lambda: _Stream([InvalidRequest("bad")], closed)))
    assert got == [] and isinstance(err, InvalidRequest)
    got, err = _collect(stages.stream_stage("read", 5.0, lambda: _Stream([], closed)))
    assert (got, err) == ([], None)


def test_a_cancelled_stage_is_not_retried():
    made: list[int] = []

    async def hang():
        made.append(1)
        await asyncio.sleep(5.0)

    async def go():
        task = asyncio.ensure_future(stages.run_stage("read", 10.0, hang))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(go())
    assert made == [1]


# ---------------------------------------------------------------------------- issue 44: the request's deadline, full queues


class _Response:
    """What a Serve handle call returns: awaitable, and cancellable by itself (``cancel()``); a
    cancelled wait on it does not cancel it, so the stage must."""

    def __init__(self, delay: float, cancelled: list[int]) -> None:
        self.delay, self.cancelled = delay, cancelled

    def __await__(self):
        return asyncio.sleep(self.delay, "late").__await__()

    def cancel(self) -> None:
        self.cancelled.append(1)


def test_a_stage_past_its_deadline_cancels_the_call_it_stops_waiting_for():
    cancelled: list[int] = []
    with pytest.raises(stages.StageTimeout):
        run(stages.run_stage("read", 0.05, lambda: _Response(1.0, cancelled), retries=0))
    assert cancelled == [1], "the deployment call would run on for no one"


def _with_deadline(timeout_s: float, coro_fn):
    async def go():
        from longrag.admission import Deadline

        token = stages.request_deadline.set(Deadline.after(timeout_s))
        try:
            return await coro_fn()
        finally:
            stages.request_deadline.reset(token)

    return run(go())


def test_the_request_deadline_bounds_a_stage_and_is_named_when_it_passes():
    cancelled: list[int] = []
    with pytest.raises(stages.DeadlinePassed) as info:
        _with_deadline(0.1, lambda: stages.run_stage("read", 10.0, lambda: _Response(1.0, cancelled)))
    assert info.value.status == 504 and info.value.detail == {"stage": "read", "request_timeout_s": 0.1}
    assert cancelled == [1]
    # a stage's own timeout shorter than what the request has left stays the stage's
    with pytest.raises(stages.StageTimeout):
        _with_deadline(10.0, lambda: stages.run_stage("encode", 0.05, lambda: _Response(1.0, []), retries=0))


def test_no_stage_starts_once_the_request_has_no_time_left():
    call, made = _calls("ok")

    async def late():
        await asyncio.sleep(0.06)
        return await stages.run_stage("retrieve", 5.0, call)

    with pytest.raises(stages.DeadlinePassed):
        _with_deadline(0.05, late)
    assert made == []
    with pytest.raises(stages.DeadlinePassed):
        _with_deadline(0.05, lambda: _drain_late_stream())


async def _drain_late_stream():
    await asyncio.sleep(0.06)
    return [x async for x in stages.stream_stage("read", 5.0, lambda: _Stream(["a"], []))]


class BackPressureError(Exception):
    """Named as Serve's refusal of a call whose deployment's queue is full."""


@pytest.mark.parametrize("exc", [BackPressureError("queue full"), _Wrapped(BackPressureError("queue full"))])
def test_a_full_queue_is_a_503_with_retry_after_and_is_not_retried(exc):
    call, made = _calls(exc)
    with pytest.raises(stages.StageOverloaded) as info:
        run(stages.run_stage("read", 5.0, call))
    assert info.value.status == 503 and info.value.retry_after_s >= 1 and len(made) == 1
