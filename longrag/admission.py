"""Admission at the door: a bounded count of the requests that need a scarce stage (the reader),
and the deadline each request carries (issue 44).

A reader on two CPU cores answers one question at a time in seconds; a request admitted past what
it can answer soon only waits, and its client gives up while the work it asked for goes on. So an
ingress admits a request that needs it only while the wait it would have is short: at most
``limit`` at once, and, with ``max_wait_s``, only while the admitted ones would be done within
that long by the reader's measured pace (its *service interval*: the time between two answers while
it is busy, an exponentially weighted mean; a cold read takes seconds, one whose top unit's KV state
is cached a fraction, so the number admitted follows the mix). The next one is refused at once with
:class:`Overloaded`, which says when to come back (never under a second). The caller answers it 503
with ``Retry-After`` before any work is done for the request (no retrieval for a question the
reader cannot take).

:class:`Deadline` is the other half: the time a request may take, from the server's config or less
when the client asks for less, checked before each stage starts (``serve.stages``).

No Ray and no web framework here: the ingress' middleware holds one :class:`Admission` per replica.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Admission", "Deadline", "Overloaded"]


class Overloaded(Exception):
    """Refused at the door: the admitted requests fill the reader; retry after ``retry_after_s``."""

    def __init__(self, in_flight: int, limit: int, retry_after_s: int) -> None:
        super().__init__(f"the reader is busy with {in_flight} requests (at most {limit} are admitted, and only "
                         f"while they would be answered soon); retry after {retry_after_s} s")
        self.in_flight, self.limit, self.retry_after_s = in_flight, limit, retry_after_s


class Admission:
    """Requests admitted while fewer than ``limit`` are and, with ``max_wait_s``, while those would
    be answered within ``max_wait_s`` at the measured service interval (thread-safe; the first is
    always admitted). ``expected_s`` is the interval assumed before two answers were measured;
    ``smoothing`` the weight of each new interval in the running mean."""

    def __init__(self, limit: int, *, max_wait_s: float | None = None, expected_s: float = 5.0,
                 smoothing: float = 0.2, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if expected_s <= 0 or not 0 < smoothing <= 1 or (max_wait_s is not None and max_wait_s <= 0):
            raise ValueError(f"expected_s and max_wait_s must be > 0 and smoothing in (0, 1], got {expected_s}, "
                             f"{max_wait_s}, {smoothing}")
        self.limit, self.max_wait_s, self.smoothing, self.clock = int(limit), max_wait_s, float(smoothing), clock
        self.service_s = float(expected_s)
        self._started: dict[int, float] = {}  # ticket -> admission time
        self._next = 0
        self._busy_since = self._last_done = 0.0
        self._lock = threading.Lock()
        self.admitted = self.refused = self.finished = 0

    @property
    def in_flight(self) -> int:
        return len(self._started)

    def wait_s(self) -> float:
        """The wait a request admitted now would have before its turn: the admitted ones at the
        service interval."""
        with self._lock:
            return len(self._started) * self.service_s

    def retry_after_s(self) -> int:
        """Whole seconds until a request would be admitted again, at the service interval (at least 1)."""
        with self._lock:
            return self._retry_after_locked()

    def _retry_after_locked(self) -> int:
        n = len(self._started)
        by_count = (n - self.limit + 1) * self.service_s
        by_wait = n * self.service_s - self.max_wait_s if self.max_wait_s is not None else 0.0
        return max(1, math.ceil(max(by_count, by_wait)))

    def _full_locked(self) -> bool:
        n = len(self._started)
        if n >= self.limit:
            return True
        return self.max_wait_s is not None and n > 0 and n * self.service_s > self.max_wait_s

    def enter(self) -> int:
        """A ticket for :meth:`leave`, or :class:`Overloaded` when no more may wait (see the class doc)."""
        with self._lock:
            if self._full_locked():
                self.refused += 1
                raise Overloaded(len(self._started), self.limit, self._retry_after_locked())
            now = self.clock()
            if not self._started:
                self._busy_since = now
            self._next += 1
            self._started[self._next] = now
            self.admitted += 1
            return self._next

    def leave(self, ticket: int, *, completed: bool = True) -> None:
        """Free the ticket's place. A ``completed`` request updates the service interval: the time
        since the last answer, or since the reader was last idle when that is later (one that
        failed or was cancelled says little about the pace of answers)."""
        with self._lock:
            if self._started.pop(ticket, None) is None:
                return
            if completed:
                now = self.clock()
                self.finished += 1
                interval = now - max(self._last_done, self._busy_since)
                self.service_s += self.smoothing * (interval - self.service_s)
                self._last_done = now

    def to_dict(self) -> dict[str, float | int | None]:
        with self._lock:
            return {"limit": self.limit, "max_wait_s": self.max_wait_s, "in_flight": len(self._started),
                    "admitted": self.admitted, "refused": self.refused, "finished": self.finished,
                    "service_s": round(self.service_s, 3)}


@dataclass(frozen=True)
class Deadline:
    """When a request must be answered by (``clock()`` seconds), and the timeout it came from."""

    at: float
    timeout_s: float

    @classmethod
    def after(cls, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> Deadline:
        return cls(at=clock() + timeout_s, timeout_s=timeout_s)

    def left(self, clock: Callable[[], float] = time.monotonic) -> float:
        return self.at - clock()


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
