"""Peak resident memory while a block runs, sampled on a thread (Ray-free)."""

from __future__ import annotations

import threading

import psutil


def process_name(p: psutil.Process) -> str:
    """A process by what it runs: a Ray worker's title (``ray::ServeReplica:app:Ingress``, ``ray::IDLE``),
    Ray's own daemons by name (``raylet``, ``gcs_server``), Python by its module (``python -m jobs.demo``),
    with its pid (two replicas of one deployment are two entries)."""
    cmd = p.cmdline()
    if cmd and cmd[0].startswith("ray::"):
        title = cmd[0].split()[0]
    elif len(cmd) > 2 and cmd[1] == "-m":
        title = f"python -m {cmd[2]}"
    elif cmd and "python" in cmd[0].rsplit("/", 1)[-1] and len(cmd) > 1:
        title = f"python {cmd[1].rsplit('/', 1)[-1]}"
    else:
        title = p.name()
    return f"{title} [{p.pid}]"


class MemorySampler:
    """Resident memory of this process (with ``children``: plus its descendants, e.g. a local Ray)
    sampled every ``interval_s`` while the ``with`` block runs: ``base_bytes`` at entry,
    ``peak_bytes`` over the block, ``extra_mb`` the peak above the base."""

    def __init__(self, interval_s: float = 0.5, *, children: bool = False) -> None:
        self.interval_s, self.children = interval_s, children
        self.base_bytes = self.peak_bytes = 0
        self._peaks: dict[int, tuple[str, int]] = {}  # pid -> (its name at its peak, its peak)
        self._last: list[tuple[psutil.Process, int]] = []  # the latest sample's processes
        self._at_peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        """Resident bytes now (and each process's peak noted in :attr:`by_process`)."""
        me = psutil.Process()
        total = 0
        self._last = []
        for p in [me, *me.children(recursive=True)] if self.children else [me]:
            try:
                rss = p.memory_info().rss
                total += rss
                self._last.append((p, rss))
                if rss >= self._peaks.get(p.pid, ("", -1))[1]:  # named at its peak only (a process may exec)
                    self._peaks[p.pid] = (process_name(p), rss)
            except psutil.Error:  # a child gone between listing and reading
                continue
        return total

    @property
    def by_process(self) -> dict[str, int]:
        """Each process's own peak over the block (or the phase), bytes, by :func:`process_name` (its name
        at its peak: a process that execs changes it); with ``children``, what held the memory."""
        return dict(self._peaks.values())

    def peaks_mb(self, top: int = 12) -> dict[str, float]:
        """The ``top`` largest per-process peaks, MB, largest first."""
        ranked = sorted(self.by_process.items(), key=lambda kv: -kv[1])[:top]
        return {name: round(rss / 2**20, 1) for name, rss in ranked}

    def at_peak_mb(self, top: int = 12) -> dict[str, float]:
        """What the ``top`` largest processes held at the moment the total peaked (the processes' own peaks,
        :meth:`peaks_mb`, need not fall together), MB, largest first."""
        ranked = sorted(self._at_peak.items(), key=lambda kv: -kv[1])[:top]
        return {name: round(rss / 2**20, 1) for name, rss in ranked}

    def _note(self, total: int) -> None:
        """Keep ``total`` as the peak, with the processes that made it, when it is a new peak."""
        if total < self.peak_bytes:
            return
        self.peak_bytes = total
        held: dict[str, int] = {}
        for p, rss in self._last:
            try:
                held[process_name(p)] = rss
            except psutil.Error:  # gone since the sample
                held[f"(gone) [{p.pid}]"] = rss
        self._at_peak = held

    def new_phase(self) -> int:
        """The peak so far, returned; from now on :attr:`peak_bytes`, :attr:`by_process` and
        :meth:`at_peak_mb` are the new phase's own."""
        before = self.peak_bytes
        self._peaks, self._at_peak, self.peak_bytes = {}, {}, 0
        self._note(self.sample())
        return before

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._note(self.sample())

    def __enter__(self) -> MemorySampler:
        self.base_bytes = self.sample()
        self._note(self.base_bytes)  # peak_bytes starts at 0
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._note(self.sample())

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
