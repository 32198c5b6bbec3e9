"""Peak resident memory while a block runs, sampled on a thread (Ray-free)."""

from __future__ import annotations

import threading

import psutil


class MemorySampler:
    """Resident memory of this process (with ``children``: plus its descendants, e.g. a local Ray)
    sampled every ``interval_s`` while the ``with`` block runs: ``base_bytes`` at entry,
    ``peak_bytes`` over the block, ``extra_mb`` the peak above the base."""

    def __init__(self, interval_s: float = 0.5, *, children: bool = False) -> None:
        self.interval_s, self.children = interval_s, children
        self.base_bytes = self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        """Resident bytes now."""
        me = psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)] if self.children else [me]:
            try:
                total += p.memory_info().rss
            except psutil.Error:  # a child gone between listing and reading
                pass
        return total

    def new_phase(self) -> int:
        """The peak so far, returned; from now on :attr:`peak_bytes` is the new phase's own peak."""
        before, self.peak_bytes = self.peak_bytes, self.sample()
        return before

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_bytes = max(self.peak_bytes, self.sample())

    def __enter__(self) -> MemorySampler:
        self.base_bytes = self.peak_bytes = self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self.sample())

    @property
    def base_mb(self) -> float:
        return self.base_bytes / 2**20

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20

    @property
    def extra_mb(self) -> float:
        """Peak above the memory at entry, MB."""
        return (self.peak_bytes - self.base_bytes) / 2**20
