"""Progress without a terminal: periodic log lines with count, rate and time left, and a last line."""

import logging

import pytest

from longrag.progress import LogProgress, progress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_log_progress_lines(caplog):
    clock = Clock()
    logger = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger="test.progress"):
        p = LogProgress(10, "read", logger, interval_s=30, clock=clock)
        clock.t = 10
        p.update(2)  # 10 s since start: under the interval, silent
        assert caplog.records == []
        clock.t = 40
        p.update(2)  # 4 done in 40 s -> 10 s each, 6 left -> ~60 s
        assert caplog.records[-1].getMessage() == "read: 4/10 (10.0 s each, 40 s elapsed, ~60 s left)"
        clock.t = 50
        p.update(6)  # done: no periodic line, the close line says it
        assert len(caplog.records) == 1
        p.close()
        p.close()  # once only
    assert [r.getMessage() for r in caplog.records][1:] == ["read: 10/10 (5.0 s each, 50 s elapsed)"]
    with pytest.raises(ValueError):
        LogProgress(-1, "x", logger)


def test_progress_picks_bar_or_log():
    logger = logging.getLogger("test.progress")
    assert isinstance(progress(3, "x", bar=False, logger=logger), LogProgress)
    bar = progress(3, "x", bar=True, logger=logger)
    bar.update(3)
    bar.close()
    assert bar.n == 3
