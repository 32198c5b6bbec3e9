"""Progress for long loops: a tqdm bar on a terminal, periodic log lines otherwise.

``ray job submit`` and CI capture output without a terminal, where a bar is either silent
(``--no-progress``) or a wall of carriage returns. :func:`progress` gives a bar when asked and a
:class:`LogProgress` otherwise: one INFO line at most every ``interval_s`` seconds (and at the end)
with the count, the rate and the time left.
"""

from __future__ import annotations

import logging
import time
from typing import Any


class LogProgress:
    """tqdm-like ``update``/``close`` that logs instead of drawing."""

    def __init__(self, total: int, desc: str, logger: logging.Logger, interval_s: float = 30.0,
                 clock: Any = time.monotonic) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total, self.desc, self.log, self.interval_s, self.clock = total, desc, logger, interval_s, clock
        self.n = 0
        self.t0 = self.last = clock()
        self.closed = False

    def line(self) -> str:
        elapsed = self.clock() - self.t0
        rate = self.n / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.n) / rate if rate > 0 else float("nan")
        per = elapsed / self.n if self.n else float("nan")
        return (f"{self.desc}: {self.n}/{self.total} ({per:.1f} s each, {elapsed:.0f} s elapsed"
                + (f", ~{left:.0f} s left)" if self.n < self.total and rate > 0 else ")"))

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last >= self.interval_s and self.n < self.total:
            self.last = now
            self.log.info(self.line())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.log.info(self.line())


def progress(total: int, desc: str, *, bar: bool, logger: logging.Logger, unit: str = "q",
             interval_s: float = 30.0) -> Any:
    """A tqdm bar when ``bar`` is true, else a :class:`LogProgress` on ``logger``."""
    if bar:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit)
    return LogProgress(total, desc, logger, interval_s)
