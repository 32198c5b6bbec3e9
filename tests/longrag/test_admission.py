"""Admission at the door and request deadlines (longrag/admission.py, issue 44), without a server:
the count, the Retry-After it derives from the durations it saw, and the deadline header."""

from __future__ import annotations

import threading

import pytest

from longrag.admission import Admission, Deadline, Overloaded, parse_timeout_header


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_at_most_limit_are_admitted_and_a_place_freed_admits_the_next():
    adm = Admission(2, clock=Clock())
    a, b = adm.enter(), adm.enter()
    with pytest.raises(Overloaded) as info:
        adm.enter()
    assert (info.value.in_flight, info.value.limit) == (2, 2) and adm.refused == 1
    adm.leave(a)
    adm.leave(a)  # twice: no second place
    c = adm.enter()
    with pytest.raises(Overloaded):
        adm.enter()
    adm.leave(b), adm.leave(c)
    assert adm.in_flight == 0 and adm.to_dict()["admitted"] == 3


def test_the_service_interval_is_the_time_between_answers_while_busy():
    clock = Clock()
    adm = Admission(8, expected_s=5.0, smoothing=0.5, clock=clock)
    a, b = adm.enter(), adm.enter()
    clock.t += 3.0
    adm.leave(a)  # 3 s since the reader became busy: 5 + 0.5 * (3 - 5) = 4
    assert adm.service_s == pytest.approx(4.0)
    clock.t += 1.0
    adm.leave(b)  # 1 s after the last answer: 4 + 0.5 * (1 - 4) = 2.5
    assert adm.service_s == pytest.approx(2.5)
    clock.t += 100.0  # idle: the next interval starts when it is busy again, not at the last answer
    c = adm.enter()
    clock.t += 2.5
    adm.leave(c)
    assert adm.service_s == pytest.approx(2.5)
    d = adm.enter()
    clock.t += 50
    adm.leave(d, completed=False)  # a timeout or an error says nothing of the reader's pace
    assert adm.service_s == pytest.approx(2.5) and adm.finished == 3


def test_admitted_only_while_those_admitted_would_be_answered_within_max_wait():
    clock = Clock()
    adm = Admission(8, max_wait_s=10.0, expected_s=4.0, clock=clock)
    tickets = [adm.enter(), adm.enter(), adm.enter()]  # waits 0, 4, 8 s: admitted
    with pytest.raises(Overloaded) as info:
        adm.enter()  # 3 admitted x 4 s = 12 s > 10 s
    assert info.value.retry_after_s == 2  # 12 - 10
    adm.leave(tickets.pop(0))
    clock.t += 0.1
    adm.leave(tickets.pop(0))  # answers every 0.1 s: many more fit in 10 s
    assert adm.service_s < 4.0
    fast = Admission(8, max_wait_s=10.0, expected_s=0.5, clock=clock)
    held = [fast.enter() for _ in range(8)]  # 8 x 0.5 s = 4 s: the count is what stops it
    with pytest.raises(Overloaded) as info:
        fast.enter()
    assert info.value.retry_after_s == 1 and len(held) == 8
    alone = Admission(1, max_wait_s=1.0, expected_s=60.0, clock=clock)
    alone.enter()  # the first is always admitted, however slow the reader


def test_concurrent_threads_never_exceed_the_limit():
    adm, seen, lock = Admission(3), [], threading.Lock()
    barrier = threading.Barrier(12)

    def worker():
        barrier.wait()
        for _ in range(200):
            try:
                t = adm.enter()
            except Overloaded:
                continue
            with lock:
                seen.append(adm.in_flight)
            adm.leave(t)

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert seen and max(seen) <= 3 and adm.in_flight == 0


def test_deadlines_and_the_timeout_header():
    clock = Clock()
    d = Deadline.after(2.0, clock)
    clock.t += 1.5
    assert d.left(clock) == pytest.approx(0.5)
    clock.t += 1.0
    assert d.left(clock) == pytest.approx(-0.5)  # serve.stages answers 504 naming the stage (tests/serve/test_stages.py)
    assert parse_timeout_header(None, 600) == 600 and parse_timeout_header("", 600) == 600
    assert parse_timeout_header("1.5", 600) == 1.5 and parse_timeout_header("9999", 600) == 600
    for bad in ("soon", "0", "-3", "nan", "inf"):
        with pytest.raises(ValueError, match="X-Request-Timeout"):
            parse_timeout_header(bad, 600)
    with pytest.raises(ValueError):
        Admission(0)
