"""Admission at the door: a bounded count of the requests that need a scarce stage (the reader),
and the deadline each request carries (issue 44).

A reader on two CPU cores answers one question at a time in seconds; a request admitted past what
it can answer soon only waits, and its client gives up while the work it asked for goes on. So an
ingress admits at most ``limit`` such requests at once (reading, or waiting for the reader) and
refuses the next one at once with :class:`Overloaded`, which says when to come back: the time the
oldest admitted request is expected to need still, from the durations of the last ones (an
exponentially weighted mean), never under a second. The caller answers it 503 with ``Retry-After``
before any work is done for the request (no retrieval for a question the reader cannot take).

:class:`Deadline` is the other half: the time a request may take, from the server's config or less
when the client asks for less, checked before each stage starts (``serve.stages``).

No Ray and no web framework here: the ingress' middleware holds one :class:`Admission` per replica.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

__all__ = ["Admission", "Deadline", "DeadlineExceeded", "Overloaded"]


class Overloaded(Exception):
    """Refused at the door: ``limit`` requests are already admitted; retry after ``retry_after_s``."""

    def __init__(self, in_flight: int, limit: int, retry_after_s: int) -> None:
        super().__init__(f"the reader is busy with {in_flight} requests (the limit is {limit}); "
                         f"retry after {retry_after_s} s")
        self.in_flight, self.limit, self.retry_after_s = in_flight, limit, retry_after_s


class Admission:
    """At most ``limit`` requests admitted at once (thread-safe). ``expected_s`` is the duration
    assumed before any request has finished (the first Retry-After); ``smoothing`` the weight of
    each finished request in the running mean of durations."""

    def __init__(self, limit: int, *, expected_s: float = 5.0, smoothing: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if expected_s <= 0 or not 0 < smoothing <= 1:
            raise ValueError(f"expected_s must be > 0 and smoothing in (0, 1], got {expected_s}, {smoothing}")
        self.limit, self.smoothing, self.clock = int(limit), float(smoothing), clock
        self.mean_s = float(expected_s)
        self._started: dict[int, float] = {}  # ticket -> admission time
        self._next = 0
        self._lock = threading.Lock()
        self.admitted = self.refused = self.finished = 0

    @property
    def in_flight(self) -> int:
        return len(self._started)

    def retry_after_s(self) -> int:
        """Whole seconds until a place is expected to free: what the oldest admitted request still
        needs by the mean duration (at least 1)."""
        with self._lock:
            return self._retry_after_locked()

    def _retry_after_locked(self) -> int:
        if not self._started:
            return 1
        age = self.clock() - min(self._started.values())
        return max(1, math.ceil(self.mean_s - age))

    def enter(self) -> int:
        """A ticket for :meth:`leave`, or :class:`Overloaded` when ``limit`` are admitted."""
        with self._lock:
            if len(self._started) >= self.limit:
                self.refused += 1
                raise Overloaded(len(self._started), self.limit, self._retry_after_locked())
            self._next += 1
            self._started[self._next] = self.clock()
            self.admitted += 1
            return self._next

    def leave(self, ticket: int, *, completed: bool = True) -> None:
        """Free the ticket's place; a ``completed`` request's duration updates the mean (one that
        failed or was cancelled early says little about how long an answer takes)."""
        with self._lock:
            started = self._started.pop(ticket, None)
            if started is None:
                return
            if completed:
                self.finished += 1
                self.mean_s += self.smoothing * ((self.clock() - started) - self.mean_s)

    @contextlib.contextmanager
    def admitted_request(self) -> Iterator[None]:
        """``with admission.admitted_request():`` the block holds a place (raises :class:`Overloaded`)."""
        ticket = self.enter()
        completed = False
        try:
            yield
            completed = True
        finally:
            self.leave(ticket, completed=completed)

    def to_dict(self) -> dict[str, float | int]:
        with self._lock:
            return {"limit": self.limit, "in_flight": len(self._started), "admitted": self.admitted,
                    "refused": self.refused, "finished": self.finished, "mean_s": round(self.mean_s, 3)}


class DeadlineExceeded(Exception):
    """The request's deadline passed before a stage could start."""

    def __init__(self, stage: str, timeout_s: float) -> None:
        super().__init__(f"the request's deadline of {timeout_s:g} s passed before the {stage} stage could start")
        self.stage, self.timeout_s = stage, timeout_s


@dataclass(frozen=True)
class Deadline:
    """When a request must be answered by (``clock()`` seconds), and the timeout it came from."""

    at: float
    timeout_s: float

    @classmethod
    def after(cls, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> "Deadline":
        return cls(at=clock() + timeout_s, timeout_s=timeout_s)

    def left(self, clock: Callable[[], float] = time.monotonic) -> float:
        return self.at - clock()

    def check(self, stage: str, clock: Callable[[], float] = time.monotonic) -> float:
        """The seconds left for ``stage``; :class:`DeadlineExceeded` when none are."""
        left = self.left(clock)
        if left <= 0:
            raise DeadlineExceeded(stage, self.timeout_s)
        return left


def parse_timeout_header(value: str | None, limit_s: float) -> float:
    """The request's timeout: the client's ``X-Request-Timeout`` (seconds) when it asks for less
    than ``limit_s``, else ``limit_s``. A value that is not a positive number is a ValueError."""
    if value is None or value == "":
        return limit_s
    try:
        asked = float(value)
    except ValueError:
        raise ValueError(f"X-Request-Timeout must be a number of seconds, got {value!r}") from None
    if not math.isfinite(asked) or asked <= 0:
        raise ValueError(f"X-Request-Timeout must be a positive number of seconds, got {value!r}")
    return min(asked, limit_s)
