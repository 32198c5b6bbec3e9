"""The one rate limiter: the token bucket's arithmetic on a given clock, and the async pacer's
spacing on the real one."""

import asyncio
import time

import pytest

from longrag.ratelimit import AsyncRateLimiter, TokenBucket


def test_token_bucket_refills_at_its_rate():
    bucket = TokenBucket(rate=2.0, burst=3, stamp=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)  # one token comes in 1/rate seconds
    assert bucket.take(0.5) == 0.0
    assert bucket.take(0.5) > 0
    assert bucket.full_at() == pytest.approx(0.5 + 3 / 2.0)


@pytest.mark.parametrize("rate, burst", [(0, 1), (-1, 1), (1, 0)])
def test_token_bucket_refuses_a_bucket_that_never_fills(rate, burst):
    with pytest.raises(ValueError):
        TokenBucket(rate, burst)


def test_async_limiter_spaces_starts_by_one_over_qps():
    async def starts(qps):
        limiter, times = AsyncRateLimiter(qps), []

        async def one():
            await limiter.wait()
            times.append(time.monotonic())

        await asyncio.gather(*(one() for _ in range(5)))
        return times

    times = asyncio.run(starts(20.0))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(gaps) == 4 and min(gaps) >= 0.05 - 0.005, gaps  # never faster than 20 a second
    assert times[-1] - times[0] >= 4 * 0.05 - 0.01
    unlimited = asyncio.run(starts(None))
    assert unlimited[-1] - unlimited[0] < 0.05
    with pytest.raises(ValueError):
        AsyncRateLimiter(0)
