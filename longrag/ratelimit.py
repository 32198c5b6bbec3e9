"""One rate limiter: a token bucket, used by the HTTP guard (per client, answering "retry after")
and by the LRGinstruction teacher's calls (an async pacer that waits for its turn).

Hand-written because it is a dozen lines and both callers need its arithmetic, not a framework's
policy: the guard answers a 429 with the wait instead of sleeping; ``aiolimiter`` and ``limits``
offer one of the two shapes each.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """``rate`` tokens a second, at most ``burst``; :meth:`take` returns 0 or the seconds to wait."""

    rate: float
    burst: int
    tokens: float = -1.0
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, got {self.rate}, {self.burst}")
        if self.tokens < 0:
            self.tokens = float(self.burst)

    def full_at(self) -> float:
        """When, left alone, the bucket is full again (a new bucket is the same from then on)."""
        return self.stamp + (self.burst - self.tokens) / self.rate

    def take(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class AsyncRateLimiter:
    """At most ``qps`` starts per second (None: unlimited) for the coroutines of one event loop, in
    the order they asked: a :class:`TokenBucket` of burst 1, waited on instead of refused."""

    def __init__(self, qps: float | None, burst: int = 1) -> None:
        if qps is not None and qps <= 0:
            raise ValueError(f"qps must be > 0 or None, got {qps}")
        self.bucket = TokenBucket(qps, burst) if qps else None
        self._lock: asyncio.Lock | None = None

    async def wait(self) -> None:
        if self.bucket is None:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            while (delay := self.bucket.take()) > 0:
                await asyncio.sleep(delay)
