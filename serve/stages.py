"""Deadlines and one retry for the stages of a request (``serve.timeouts``), used by the ingress.

Every call the ingress makes to another deployment is one *stage*: ``encode`` (QueryEncoder),
``retrieve`` (Retriever), ``read`` (Reader and its LLM), ``dual`` (a dual-perspective strategy),
``longcontext`` (/v1/longcontext). :func:`run_stage` gives a stage its deadline and retries it once
when it fails (a replica that died mid-call, an LLM that raised): all stages only read, so a retry
is safe. The outcome is one of

* the stage's result;
* the stage's own client error, unchanged (:class:`longrag.types.InvalidRequest`, such as a question
  the encoder refuses: the ingress maps it to 422);
* :class:`StageTimeout` (HTTP 504) when the deadline passed with no failure seen;
* :class:`StageFailed` (HTTP 503) when the stage failed twice, or failed and then ran out of time;
* :class:`StageOverloaded` (HTTP 503 with ``Retry-After``) when the deployment behind it refused the
  call because its queue is full (Serve's ``max_queued_requests``): not retried.

The request's own deadline (:data:`request_deadline`, set per request by the ingress' middleware
from ``serve.request_timeout_s`` or the client's ``X-Request-Timeout``) is checked before a stage
starts (:class:`DeadlinePassed`, 504) and bounds the stage's own: a stage gets the lesser of its
timeout and the time the request has left. When the deadline passes during a stage, the stage's
call is cancelled, and with it the work behind it (Serve cancels a cancelled handle call's request).

A streamed answer (:func:`stream_stage`) is retried only while nothing of it was sent: once a token
went out, a failure ends the stream with an error event (:func:`error_event`) instead. The attempts
are tenacity's (``AsyncRetrying``: what is retried, how often, what is recorded); the deadline is
the stage's own, across attempts.
No Ray here: Ray's errors are recognized by what they wrap, not imported.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from longrag.admission import Deadline
from longrag.types import InvalidRequest

log = logging.getLogger(__name__)

T = TypeVar("T")

STAGES = ("encode", "retrieve", "read", "dual", "longcontext")

#: The deadline of the request being served (None outside one: no limit but the stage's own).
request_deadline: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("request_deadline", default=None)


def cause(exc: BaseException) -> BaseException:
    """The user exception inside a Ray task error (a deployment call that raised)."""
    return getattr(exc, "cause", None) or exc


def one_line(exc: BaseException) -> str:
    text = str(cause(exc)).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def describe(exc: BaseException) -> str:
    """``Type: message`` of the innermost error, on one line."""
    return f"{type(cause(exc)).__name__}: {one_line(exc)}"[:500]


def is_client_error(exc: BaseException) -> bool:
    """A stage that refused its input (:class:`longrag.types.InvalidRequest`: a bad question, a bad
    strategy): not retried, the caller answers it as a 4xx. Any other error, a plain ``ValueError``
    included (a misconfiguration, a decoding error), is the server's: retried, then 503. Ray
    re-raises a deployment's exception as an error that is also of its class, with it as ``cause``."""
    return isinstance(exc, InvalidRequest) or isinstance(cause(exc), InvalidRequest)


class StageError(Exception):
    """A stage that did not answer: rendered as ``{"error": {code, message, detail}}`` with ``status``."""

    status = 500
    code = "internal_error"

    def __init__(self, stage: str, message: str, detail: dict[str, Any]) -> None:
        super().__init__(message)
        self.stage, self.message, self.detail = stage, message, {"stage": stage, **detail}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "detail": self.detail}}


class StageTimeout(StageError):
    status, code = 504, "timeout"

    def __init__(self, stage: str, timeout_s: float) -> None:
        super().__init__(stage, f"the {stage} stage did not answer within {timeout_s:g} s "
                         f"(serve.timeouts.{stage}_s)", {"timeout_s": timeout_s})


class DeadlinePassed(StageError):
    """The request's deadline passed before the stage could start, or while it ran."""

    status, code = 504, "timeout"

    def __init__(self, stage: str, timeout_s: float) -> None:
        super().__init__(stage, f"the request's deadline of {timeout_s:g} s passed before the {stage} stage "
                         "finished (serve.request_timeout_s, or the client's X-Request-Timeout)",
                         {"request_timeout_s": timeout_s})


class StageOverloaded(StageError):
    """The deployment behind the stage refused the call: its queue is full."""

    status, code = 503, "overloaded"

    def __init__(self, stage: str, error: str, retry_after_s: int = 1) -> None:
        super().__init__(stage, f"the {stage} stage is at capacity ({error}); retry after {retry_after_s} s",
                         {"retry_after_s": retry_after_s})
        self.retry_after_s = retry_after_s


def is_backpressure(exc: BaseException) -> bool:
    """Serve's refusal of a call whose deployment's queue is full (``ray.serve.exceptions.BackPressureError``,
    recognized by name: no Ray here), directly or from a deployment the stage called."""
    return any(type(e).__name__ == "BackPressureError" for e in (exc, cause(exc)))


class StageFailed(StageError):
    status, code = 503, "unavailable"

    def __init__(self, stage: str, errors: list[str], *, timeout_s: float | None = None,
                 streamed: bool = False) -> None:
        if streamed:
            why = "failed after the answer had started streaming"
        elif timeout_s is not None:
            why = f"failed and its retry did not answer within {timeout_s:g} s (serve.timeouts.{stage}_s)"
        else:
            why = f"failed {len(errors)} times"
        super().__init__(stage, f"the {stage} stage {why}: {errors[-1]}; the request can be retried",
                         {"attempts": len(errors), "errors": errors})


def error_event(exc: BaseException, stage: str = "read") -> dict[str, Any]:
    """The one error shape for a failure inside a stream whose status line is already sent."""
    if isinstance(exc, StageError):
        return exc.body()
    return {"error": {"code": "internal_error", "message": describe(exc), "detail": {"stage": stage}}}


async def _await(aw: Awaitable[T]) -> T:
    """``await aw``; when the wait is cancelled (the stage's deadline, the request's, or the client
    gone), ``aw.cancel()`` too: a Serve ``DeploymentResponse`` whose awaiting task is cancelled is not
    cancelled itself, and its deployment would work on for no one (Serve cancels the calls a
    cancelled request made, so the cancel reaches every hop below)."""
    try:
        return await aw
    except asyncio.CancelledError:
        cancel = getattr(aw, "cancel", None)
        if callable(cancel):
            cancel()
        raise


def _retryable(exc: BaseException) -> bool:
    """A failure worth another attempt: not a client error, not the stage's deadline (no time is
    left), not a full queue (a retry at once would be refused too), not a cancellation
    (``BaseException``: the caller went away)."""
    return (isinstance(exc, Exception) and not isinstance(exc, TimeoutError) and not is_client_error(exc)
            and not is_backpressure(exc))


def _budget(stage: str, timeout_s: float) -> tuple[float, Deadline | None]:
    """The stage's time: its own timeout, or less when the request's deadline is nearer (then that
    deadline, to name it when it passes); :class:`DeadlinePassed` when the request has no time left."""
    deadline = request_deadline.get()
    if deadline is None:
        return timeout_s, None
    left = deadline.left()
    if left <= 0:
        raise DeadlinePassed(stage, deadline.timeout_s)
    return (left, deadline) if left < timeout_s else (timeout_s, None)


async def _attempts(stage: str, timeout_s: float, retries: int, errors: list[str], trace: dict[str, Any] | None,
                    attempt: Callable[[], Awaitable[T]], deadline: Deadline | None = None) -> T:
    """``await attempt()``, again up to ``retries`` times after a :func:`_retryable` failure (tenacity,
    no wait between attempts); each failure is described into ``errors`` and logged, a retry is
    recorded as ``trace[f"{stage}_retries"]``. The outcome is classified here: a client error is
    raised as it is, the deadline (``TimeoutError``) as :func:`_timed_out` (``deadline``: the
    request's, when it was nearer than the stage's own), a full queue as :class:`StageOverloaded`,
    any other last failure as :class:`StageFailed`."""

    def record(state: RetryCallState) -> None:
        errors.append(describe(state.outcome.exception()))  # type: ignore[union-attr, arg-type]
        log.warning("stage %s failed (attempt %d): %s", stage, len(errors), errors[-1])
        if trace is not None and len(errors) <= retries:
            trace[f"{stage}_retries"] = len(errors)

    try:
        async for try_ in AsyncRetrying(stop=stop_after_attempt(retries + 1), retry=retry_if_exception(_retryable),
                                        after=record, reraise=True):
            with try_:
                return await attempt()
    except TimeoutError:
        raise _timed_out(stage, timeout_s, errors, deadline) from None
    except Exception as exc:  # noqa: BLE001 - classified here
        if is_client_error(exc):
            raise
        if is_backpressure(exc):
            raise StageOverloaded(stage, describe(exc)) from None
        raise StageFailed(stage, errors) from None
    raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover


def _timed_out(stage: str, timeout_s: float, errors: list[str], deadline: Deadline | None = None) -> StageError:
    if deadline is not None:
        return DeadlinePassed(stage, deadline.timeout_s)
    return StageFailed(stage, errors, timeout_s=timeout_s) if errors else StageTimeout(stage, timeout_s)


async def run_stage(stage: str, timeout_s: float, call: Callable[[], Awaitable[T]], *, retries: int = 1,
                    trace: dict[str, Any] | None = None) -> T:
    """``await call()`` within ``timeout_s`` (the whole stage, its retry included); a failure other
    than a client error is retried up to ``retries`` times (recorded as ``trace[f"{stage}_retries"]``).
    The request's deadline, when nearer, bounds it instead (:func:`_budget`)."""
    timeout_s, request = _budget(stage, timeout_s)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    errors: list[str] = []
    return await _attempts(stage, timeout_s, retries, errors, trace,
                           lambda: asyncio.wait_for(_await(call()), max(deadline - loop.time(), 0.001)), request)


_END = object()


async def stream_stage(stage: str, timeout_s: float, open_stream: Callable[[], AsyncIterator[T]], *,
                       retries: int = 1, trace: dict[str, Any] | None = None) -> AsyncIterator[T]:
    """The items of ``open_stream()`` within ``timeout_s`` for the whole stream. Opening it and
    getting its first item is retried (a fresh stream) up to ``retries`` times; once an item was
    sent, a failure ends the stream with :class:`StageFailed` (``streamed``). Raises as
    :func:`run_stage` does otherwise. Each item has the deadline's remaining time (``wait_for``, not
    a scope around the ``yield``: the consumer's own awaits are never cancelled by it)."""
    timeout_s, request = _budget(stage, timeout_s)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    errors: list[str] = []

    def left() -> float:
        return max(deadline - loop.time(), 0.001)

    async def open_first() -> tuple[AsyncIterator[T], Any]:
        stream = open_stream()
        try:
            return stream, await asyncio.wait_for(_await(stream.__anext__()), left())
        except StopAsyncIteration:
            return stream, _END
        except BaseException:
            await _close(stream)  # a failed attempt's stream is stopped before the next one opens
            raise

    stream, item = await _attempts(stage, timeout_s, retries, errors, trace, open_first, request)
    if item is _END:
        return
    done = False
    try:
        yield item
        while True:
            try:
                item = await asyncio.wait_for(_await(stream.__anext__()), left())
            except StopAsyncIteration:
                done = True
                return
            yield item
    except TimeoutError:
        raise _timed_out(stage, timeout_s, errors, request) from None
    except Exception as exc:  # noqa: BLE001 - classified here
        if is_client_error(exc):
            raise
        errors.append(describe(exc))
        log.warning("streamed stage %s failed after items were sent: %s", stage, errors[-1])
        raise StageFailed(stage, errors, streamed=True) from None
    finally:
        if not done:  # abandoned (failed, timed out, or the client went away): stop the work behind it
            await _close(stream)


async def _close(stream: Any) -> None:
    close = getattr(stream, "cancel", None) or getattr(stream, "aclose", None)
    if close is None:
        return
    try:
        res = close()
        if asyncio.iscoroutine(res):
            await res
    except Exception:  # noqa: BLE001 - a stream that cannot close is left to its owner
        pass
