"""How many threads llama.cpp runs: the CPUs a process (or a Ray replica) really holds.

Apart from the engine (:mod:`longrag.llm.llamacpp`) because those who size it do not load it: the
``LLMServer`` deployment decides its replica's threads before it builds the engine, and jobs print or
pass the number without a model.
"""

from __future__ import annotations

import math
import os

__all__ = ["resolve_threads", "usable_cpus"]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def resolve_threads(n_threads: int | None, cpus: float | None = None) -> int:
    """llama.cpp threads for a call of ``n_threads`` (``llm.n_threads``): a number is kept; None takes
    ``cpus`` (the CPUs a Ray replica holds) rounded up, or every usable CPU when ``cpus`` is None, and
    never more than the process may run on.

    llama-cpp-python's own default is ``cpu_count() // 2`` (one thread on a 2-core machine): it
    assumes hyper-threads, where a second thread per core buys little. Generation is bound by memory
    bandwidth and prompt evaluation by arithmetic; both scale with the cores a replica really holds."""
    if n_threads is not None:
        if n_threads <= 0:
            raise ValueError(f"n_threads must be positive or None, got {n_threads}")
        return int(n_threads)
    if cpus is not None and cpus <= 0:
        raise ValueError(f"cpus must be positive or None, got {cpus}")
    limit = usable_cpus()
    return limit if cpus is None else max(1, min(limit, math.ceil(cpus - 1e-9)))
