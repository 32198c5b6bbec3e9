"""KV states of hot prompt prefixes, kept in RAM and on a node-local disk (the idea of RAGCache,
Jin et al. 2024, and TurboRAG, Lu et al. 2024, on LongRAG's long units).

The reader's prompt opens with its system message, ``Documents:`` and the top unit, so the
llama.cpp state after evaluating exactly those tokens is the same for every question whose top unit
it is. :class:`PrefixStateCache` keeps such states under a key the backend derives from everything
that shapes a state's bytes (the model file's sha256, its adapter, its chat format, the binding's
version, the context's size, batches and KV types) and the prefix's token ids (which spell the
prompt template and the unit's content), so a hit evaluates only the rest of the prompt: the
question's tokens and the units after the first.

Two tiers with byte budgets, each least-recently-used first out:

* RAM: an ordered dict of :class:`PrefixState`;
* disk (optional): one ``<key>.kv.npz`` file per state in a folder of this node, written through on
  every ``put`` (a restarted replica finds its hot units again), read back into RAM on a RAM miss;
  recency is the file's mtime, refreshed on every hit. A file that cannot be read (torn by a crash,
  bit-flipped, not an npz) is removed and counted as a miss.

The disk budget is the folder's, whichever processes share it (the replicas of a node, each given
the same budget: a process evicts down to its own): a write takes the folder's lock file
(``.kv.lock``, :mod:`filelock`), rescans the folder's own files (their sizes and mtimes: other
processes write and touch them too), removes the least recently used until the new file fits beside
the rest, and only then writes it. So the folder never holds more than its
budget, not even between a write and its eviction, and ``disk_peak_bytes`` (sampled right after each
write) is what the folder really held. A file is written to ``<key>.<random>.kv.tmp``, fsynced,
renamed over ``<key>.kv.npz`` and the folder fsynced: a crash leaves the old file or the new one,
never half of one under the real name. Temporary files are written only under the lock, so one found
while holding it (on open, on every write) was left by a killed writer and is removed, as are the
``tmp*.tmp`` files earlier versions wrote without a lock. Reads take no lock: a rename is atomic and
an open file outlives its eviction.

The cache never decides whether a state fits a prompt: the backend compares the stored token ids
with the prompt's before it loads a state, so a hit is exact by construction; a state the backend
cannot load after all is :meth:`PrefixStateCache.discard`-ed from both tiers.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
import threading
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

log = logging.getLogger(__name__)

_SUFFIX = ".kv.npz"
_TMP_SUFFIX = ".kv.tmp"
_LEGACY_TMP = "tmp*.tmp"  # what writers before the folder lock left behind (tempfile.mkstemp's names)
_LOCK_NAME = ".kv.lock"

#: what reading a damaged ``.npz`` raises: a torn or bit-flipped zip (``BadZipFile``: bad magic,
#: directory or CRC), a member cut short (``EOFError``), a compressed member (``zlib.error``), an
#: unreadable file (``OSError``), not an npz or a malformed array (``ValueError``), a member missing
#: (``KeyError``)
_UNREADABLE = (zipfile.BadZipFile, EOFError, zlib.error, OSError, ValueError, KeyError)


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
    """Lookups and occupancy of a :class:`PrefixStateCache` since it was made.

    The disk figures are the folder's (every process sharing it included) as of this process's last
    look: on open and on each of its writes, with its own removals since."""

    ram_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    puts: int = 0
    ram_evictions: int = 0
    disk_evictions: int = 0
    #: files that could not be written or read (a damaged file counts here and as a miss)
    disk_errors: int = 0
    #: temporary files of killed writers removed
    orphans_removed: int = 0
    #: entries a backend found and then could not use (llama.cpp refused the state), removed from
    #: both tiers; their lookups counted as hits above
    discarded: int = 0
    ram_bytes: int = 0
    disk_bytes: int = 0
    ram_entries: int = 0
    disk_entries: int = 0
    #: the most bytes each tier ever held (the budgets hold under load: a benchmark checks these);
    #: the disk's sampled right after each write, before anything else can remove a file
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
    tier's budget is not kept in that tier. ``lock_timeout_s``: how long a write waits for the
    folder's lock before it gives the disk up for that entry (counted in ``disk_errors``; the RAM tier
    keeps it): a put runs under the backend's model lock, so a stuck peer must not stall requests for
    long. Thread-safe, and the disk tier is safe to share between processes."""

    def __init__(self, ram_bytes: int, disk_bytes: int = 0, disk_dir: str | os.PathLike | None = None,
                 lock_timeout_s: float = 10.0) -> None:
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
        self._lock = threading.Lock()  # this object's state; taken before the folder's lock, never after
        self._folder_lock: FileLock | None = None
        self.stats = CacheStats()
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            self._folder_lock = FileLock(str(self.disk_dir / _LOCK_NAME), timeout=lock_timeout_s)
            try:
                with self._folder_lock:
                    self._make_room(0)  # orphans out, and the folder within a budget that may have shrunk
            except (Timeout, OSError) as exc:
                self.stats.disk_errors += 1
                log.warning("KV cache: could not tidy %s: %s", self.disk_dir, exc)
        self._count()

    # -- lookups ------------------------------------------------------------------------------

    def get(self, key: str) -> tuple[PrefixState | None, str]:
        """The state under ``key`` and where it was found: ``"ram"``, ``"disk"`` or ``"miss"``.
        The disk is looked at on every RAM miss: another process on the node may have written it."""
        with self._lock:
            entry = self._ram.get(key)
            if entry is not None:
                self._ram.move_to_end(key)
                self.stats.ram_hits += 1
                return entry, "ram"
            if self.disk_dir is not None:
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
            if self.disk_dir is not None:
                self._write(key, entry)
            self._count()

    def discard(self, key: str) -> None:
        """Remove ``key`` from both tiers: the backend could not use its state (llama.cpp refused to
        load it), so it must never be served again -- left in place it would fail every request for
        its unit. Counted in ``discarded``."""
        with self._lock:
            self.stats.discarded += 1
            self._ram.pop(key, None)
            if self.disk_dir is not None:
                assert self._folder_lock is not None
                path = self._path(key)
                try:
                    with self._folder_lock:
                        size = path.stat().st_size
                        path.unlink()
                    self.stats.disk_bytes -= size
                    self.stats.disk_entries -= 1
                except FileNotFoundError:
                    pass
                except (Timeout, OSError) as exc:
                    self.stats.disk_errors += 1
                    log.warning("KV cache: could not remove %s: %s", path, exc)
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
        """Write ``entry`` through to the disk tier, room made first (see the module doc): the file
        is serialized in memory so that its size is known before anything is evicted for it."""
        if entry.nbytes > self.disk_budget:
            return
        buf = io.BytesIO()
        np.savez(buf, tokens=entry.tokens, scores=entry.scores,
                 state=np.frombuffer(entry.state, dtype=np.uint8), seed=np.int64(entry.seed))
        data = buf.getbuffer()
        if len(data) > self.disk_budget:
            return
        assert self._folder_lock is not None and self.disk_dir is not None
        path = self._path(key)
        try:
            with self._folder_lock:
                if path.exists():  # written already (by another process): the same state, by its key
                    os.utime(path)
                    return
                self._make_room(len(data))
                _write_durably(path, data)
                self.stats.disk_bytes += len(data)
                self.stats.disk_entries += 1
                self.stats.disk_peak_bytes = max(self.stats.disk_peak_bytes, self.stats.disk_bytes)
        except (Timeout, OSError) as exc:  # a full or read-only disk loses the tier, never the answer
            self.stats.disk_errors += 1
            log.warning("KV cache: could not write %s: %s", path, exc)

    def _read(self, key: str) -> PrefixState | None:
        """The state in ``key``'s file; None when there is none, or when it cannot be read (then
        it is removed, unless a writer replaced it meanwhile)."""
        path = self._path(key)
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.stats.disk_errors += 1
            log.warning("KV cache: cannot open %s: %s", path, exc)
            return None
        inode: int | None = None
        with fh:
            try:
                inode = os.fstat(fh.fileno()).st_ino
                with np.load(fh, allow_pickle=False) as z:
                    entry = PrefixState(tokens=z["tokens"].astype(np.int32), state=z["state"].tobytes(),
                                        scores=z["scores"].astype(np.float32), seed=int(z["seed"]))
            except _UNREADABLE as exc:
                self.stats.disk_errors += 1
                log.warning("KV cache: dropping unreadable %s: %s", path, exc)
                self._remove_unreadable(path, inode)
                return None
        try:
            os.utime(path)  # recency for the disk tier's LRU
        except OSError:
            pass  # evicted by another process since it was opened: what was read is whole
        return entry

    def _remove_unreadable(self, path: Path, inode: int | None) -> None:
        """Remove a damaged file, under the folder's lock and only if it is still the file that was
        read: a writer may have renamed a good one over it since (writers rename under the lock)."""
        assert self._folder_lock is not None
        try:
            with self._folder_lock:
                st = path.stat()
                if inode is None or st.st_ino == inode:
                    path.unlink()
                    self.stats.disk_bytes -= st.st_size
                    self.stats.disk_entries -= 1
        except FileNotFoundError:
            pass
        except (Timeout, OSError) as exc:  # left for the next reader or eviction
            log.warning("KV cache: could not remove %s: %s", path, exc)

    def _make_room(self, need: int) -> None:
        """Under the folder's lock: remove orphaned temporary files, then the least recently used
        states until they and ``need`` more bytes fit the budget. The folder is rescanned each time
        (sizes and mtimes of its real files), as other processes write, touch and evict it too."""
        assert self.disk_dir is not None
        for pattern in ("*" + _TMP_SUFFIX, _LEGACY_TMP):
            for tmp in self.disk_dir.glob(pattern):
                try:
                    tmp.unlink()
                    self.stats.orphans_removed += 1
                except FileNotFoundError:
                    pass
        files: list[tuple[float, str, int, Path]] = []
        for path in self.disk_dir.glob("*" + _SUFFIX):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime, path.name, st.st_size, path))
        files.sort()  # oldest first; the name breaks ties so that every process picks the same file
        total = sum(f[2] for f in files)
        kept = len(files)
        for _, _, size, path in files:
            if total + need <= self.disk_budget:
                break
            path.unlink(missing_ok=True)
            total -= size
            kept -= 1
            self.stats.disk_evictions += 1
        self.stats.disk_bytes, self.stats.disk_entries = total, kept
        self.stats.disk_peak_bytes = max(self.stats.disk_peak_bytes, total)

    def _count(self) -> None:
        s = self.stats
        s.ram_entries, s.ram_bytes = len(self._ram), sum(e.nbytes for e in self._ram.values())
        s.ram_peak_bytes = max(s.ram_peak_bytes, s.ram_bytes)


def _write_durably(path: Path, data: memoryview) -> None:
    """``data`` to ``path`` through a temporary file in its folder: written, fsynced, renamed over
    ``path``, then the folder fsynced, so that after a crash ``path`` is the old file or the whole new
    one (a rename can reach the disk before the data it names; the folder's fsync makes the rename
    itself durable). The temporary file is removed on any failure."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name[: -len(_SUFFIX)] + ".", suffix=_TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """fsync a folder where the platform allows it (POSIX; Windows cannot open one: skipped)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a folder: the rename stays as durable as they make it
        pass
    finally:
        os.close(fd)
