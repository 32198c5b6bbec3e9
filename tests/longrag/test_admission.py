"""Admission at the door and request deadlines (longrag/admission.py, issue 44), without a server:
the count, the Retry-After it derives from the durations it saw, and the deadline header."""

from __future__ import annotations

import threading

import pytest

from longrag.admission import Admission, Deadline, DeadlineExceeded, Overloaded, parse_timeout_header


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


def test_retry_after_is_what_the_oldest_still_needs_by_the_mean_duration():
    clock = Clock()
    adm = Admission(1, expected_s=5.0, smoothing=0.5, clock=clock)
    t = adm.enter()
    clock.t += 2.0
    with pytest.raises(Overloaded) as info:
        adm.enter()
    assert info.value.retry_after_s == 3  # 5 s expected, 2 s gone
    clock.t += 7.0
    adm.leave(t)  # took 9 s: mean 5 + 0.5 * (9 - 5) = 7
    assert adm.mean_s == pytest.approx(7.0)
    t = adm.enter()
    clock.t += 0.5
    assert adm.retry_after_s() == 7  # ceil(7 - 0.5)
    clock.t += 30
    assert adm.retry_after_s() == 1  # overdue: never under a second
    adm.leave(t, completed=False)  # a failed or cancelled request says nothing of durations
    assert adm.mean_s == pytest.approx(7.0) and adm.retry_after_s() == 1


def test_the_context_manager_frees_its_place_on_errors():
    adm = Admission(1)
    with pytest.raises(ZeroDivisionError), adm.admitted_request():
        1 / 0
    with adm.admitted_request():
        assert adm.in_flight == 1
    assert adm.in_flight == 0 and adm.finished == 1


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
    assert d.check("read", clock) == pytest.approx(0.5)
    clock.t += 1.0
    with pytest.raises(DeadlineExceeded, match="2 s passed before the read stage"):
        d.check("read", clock)
    assert parse_timeout_header(None, 600) == 600 and parse_timeout_header("", 600) == 600
    assert parse_timeout_header("1.5", 600) == 1.5 and parse_timeout_header("9999", 600) == 600
    for bad in ("soon", "0", "-3", "nan", "inf"):
        with pytest.raises(ValueError, match="X-Request-Timeout"):
            parse_timeout_header(bad, 600)
    with pytest.raises(ValueError):
        Admission(0)
