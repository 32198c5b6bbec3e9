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
