"""KV states of hot prompt prefixes, kept in RAM and on a node-local disk (the idea of RAGCache,
Jin et al. 2024, and TurboRAG, Lu et al. 2024, on LongRAG's long units).

The reader's prompt opens with its system message, ``Documents:`` and the top unit, so the
llama.cpp state after evaluating exactly those tokens is the same for every question whose top unit
it is. :class:`PrefixStateCache` keeps such states under a key the backend derives from the model
file's sha256, its adapter, its chat format and the prefix's token ids (which spell the prompt
template and the unit's content), so a hit evaluates only the rest of the prompt: the question's
tokens and the units after the first.

Two tiers with byte budgets, each least-recently-used first out:

* RAM: an ordered dict of :class:`PrefixState`;
* disk (optional): one ``<key>.kv.npz`` file per state in a folder of this node, written through on
  every ``put`` (a restarted replica finds its hot units again), read back into RAM on a RAM miss;
  recency is the file's mtime, refreshed on every hit. A file that cannot be read is removed and
  counted as a miss.

The cache never decides whether a state fits a prompt: the backend compares the stored token ids
with the prompt's before it loads a state, so a hit is exact by construction.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_SUFFIX = ".kv.npz"


@dataclass(frozen=True)
class PrefixState:
    """A backend's state after evaluating exactly ``tokens`` (llama.cpp: ``llama_state_get_data``)."""

    tokens: np.ndarray  # int32, the prefix's token ids
    state: bytes
    scores: np.ndarray  # float32 (1, vocab): the last row of logits the backend keeps beside it
    seed: int = 0

    @property
    def nbytes(self) -> int:
        return len(self.state) + self.tokens.nbytes + self.scores.nbytes


@dataclass
class CacheStats:
    """Lookups and occupancy of a :class:`PrefixStateCache` since it was made."""

    ram_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    puts: int = 0
    ram_evictions: int = 0
    disk_evictions: int = 0
    disk_errors: int = 0
    ram_bytes: int = 0
    disk_bytes: int = 0
    ram_entries: int = 0
    disk_entries: int = 0
    #: the most bytes each tier ever held (the budgets hold under load: a benchmark checks these)
    ram_peak_bytes: int = 0
    disk_peak_bytes: int = 0
    largest_entry_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        n = self.ram_hits + self.disk_hits + self.misses
        return (self.ram_hits + self.disk_hits) / n if n else 0.0

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        out["hit_rate"] = round(self.hit_rate, 4)
        return out


class PrefixStateCache:
    """RAM and disk tiers of :class:`PrefixState` with byte budgets (see the module doc).

    ``ram_bytes`` > 0 is required; ``disk_bytes`` 0 turns the disk tier off. An entry larger than a
    tier's budget is not kept in that tier. Thread-safe."""

    def __init__(self, ram_bytes: int, disk_bytes: int = 0, disk_dir: str | os.PathLike | None = None) -> None:
        if ram_bytes <= 0:
            raise ValueError(f"ram_bytes must be positive, got {ram_bytes}")
        if disk_bytes < 0:
            raise ValueError(f"disk_bytes must be >= 0, got {disk_bytes}")
        if disk_bytes and disk_dir is None:
            raise ValueError("a disk tier (disk_bytes > 0) needs disk_dir")
        self.ram_budget = int(ram_bytes)
        self.disk_budget = int(disk_bytes)
        self.disk_dir = Path(disk_dir).expanduser() if disk_bytes else None
        self._ram: OrderedDict[str, PrefixState] = OrderedDict()
        self._disk: dict[str, int] = {}  # key -> file bytes
        self._lock = threading.Lock()
        self.stats = CacheStats()
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            for path in self.disk_dir.glob("*" + _SUFFIX):
                self._disk[path.name[: -len(_SUFFIX)]] = path.stat().st_size
            self._evict_disk()
            self._count()

    # -- lookups ------------------------------------------------------------------------------

    def get(self, key: str) -> tuple[PrefixState | None, str]:
        """The state under ``key`` and where it was found: ``"ram"``, ``"disk"`` or ``"miss"``."""
        with self._lock:
            entry = self._ram.get(key)
            if entry is not None:
                self._ram.move_to_end(key)
                self.stats.ram_hits += 1
                return entry, "ram"
            if key in self._disk:
                entry = self._read(key)
                if entry is not None:
                    self.stats.disk_hits += 1
                    self._put_ram(key, entry)
                    self._count()
                    return entry, "disk"
            self.stats.misses += 1
            return None, "miss"

    def put(self, key: str, entry: PrefixState) -> None:
        with self._lock:
            self.stats.puts += 1
            self.stats.largest_entry_bytes = max(self.stats.largest_entry_bytes, entry.nbytes)
            self._put_ram(key, entry)
            if self.disk_dir is not None and key not in self._disk:
                self._write(key, entry)
            self._count()

    def clear(self) -> None:
        """Empty the RAM tier (the disk tier stays: it outlives the process by design)."""
        with self._lock:
            self._ram.clear()
            self._count()

    # -- tiers --------------------------------------------------------------------------------

    def _put_ram(self, key: str, entry: PrefixState) -> None:
        if entry.nbytes > self.ram_budget:
            return
        self._ram[key] = entry
        self._ram.move_to_end(key)
        total = sum(e.nbytes for e in self._ram.values())
        while total > self.ram_budget:
            _, old = self._ram.popitem(last=False)
            total -= old.nbytes
            self.stats.ram_evictions += 1

    def _path(self, key: str) -> Path:
        assert self.disk_dir is not None
        return self.disk_dir / (key + _SUFFIX)

    def _write(self, key: str, entry: PrefixState) -> None:
        if entry.nbytes > self.disk_budget:
            return
        fd, tmp = tempfile.mkstemp(dir=self.disk_dir, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, tokens=entry.tokens, scores=entry.scores,
                         state=np.frombuffer(entry.state, dtype=np.uint8), seed=np.int64(entry.seed))
            os.replace(tmp, self._path(key))
        except OSError as exc:  # a full or read-only disk loses the tier, never the answer
            self.stats.disk_errors += 1
            log.warning("KV cache: could not write %s: %s", self._path(key), exc)
            Path(tmp).unlink(missing_ok=True)
            return
        self._disk[key] = self._path(key).stat().st_size
        self._evict_disk(keep=key)

    def _read(self, key: str) -> PrefixState | None:
        path = self._path(key)
        try:
            with np.load(path, allow_pickle=False) as z:
                entry = PrefixState(tokens=z["tokens"].astype(np.int32), state=z["state"].tobytes(),
                                    scores=z["scores"].astype(np.float32), seed=int(z["seed"]))
            os.utime(path)  # recency for the disk tier's LRU
            return entry
        except (OSError, ValueError, KeyError) as exc:
            self.stats.disk_errors += 1
            log.warning("KV cache: dropping unreadable %s: %s", path, exc)
            path.unlink(missing_ok=True)
            self._disk.pop(key, None)
            return None

    def _evict_disk(self, keep: str | None = None) -> None:
        """Remove the least recently used files until the tier fits its budget (``keep`` last: the
        file just written goes only when it alone is over the budget)."""
        if self.disk_dir is None:
            return
        total = sum(self._disk.values())
        by_age = sorted(self._disk, key=lambda k: (k == keep, self._mtime(k)))
        for key in by_age:
            if total <= self.disk_budget:
                break
            total -= self._disk.pop(key)
            self._path(key).unlink(missing_ok=True)
            self.stats.disk_evictions += 1

    def _mtime(self, key: str) -> float:
        try:
            return self._path(key).stat().st_mtime
        except OSError:
            return 0.0

    def _count(self) -> None:
        s = self.stats
        s.ram_entries, s.ram_bytes = len(self._ram), sum(e.nbytes for e in self._ram.values())
        s.disk_entries, s.disk_bytes = len(self._disk), sum(self._disk.values())
        s.ram_peak_bytes = max(s.ram_peak_bytes, s.ram_bytes)
        s.disk_peak_bytes = max(s.disk_peak_bytes, s.disk_bytes)
