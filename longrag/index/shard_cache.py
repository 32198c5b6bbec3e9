"""A node-local cache of shard files, keyed by each file's sha256: a replica that starts, restarts or
scales up on a node that loaded the shard before neither downloads nor re-hashes it, and its FAISS
index is memory-mapped from the cached file (``faiss.IO_FLAG_MMAP_IFC``: the vectors stay in the
page cache, shared by every replica of the shard on the node, instead of a private copy per process).

* A file of a remote store (S3, GCS) is streamed once into ``<root>/files/<sha256>`` (hashed as it
  arrives, checked against the manifest's sha256 and size, renamed into place only when it matches:
  a torn or foreign file never has a final name), then read from there.
* A file of a local store is used where it is; what is cached is the proof that it was hashed: a
  stamp ``<root>/stamps/<sha256>`` holding its path, size and modification time. The next load
  whose file still has that size and time skips the hash; any change hashes it again.

A cached file is trusted by its name (it was verified when written); :meth:`ShardFileCache.path`
with ``verify_cached=True`` hashes it again. Eviction is left to the operator (``rm -r`` of the root
at any time: the next load fetches again); the root defaults to ``$LONGRAG_SHARD_CACHE`` or
``~/.cache/longrag/shards``. Ray-free.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from longrag.store import ChecksumError

log = logging.getLogger(__name__)

CACHE_ENV = "LONGRAG_SHARD_CACHE"
BLOCK = 8 << 20


def default_cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "longrag" / "shards"


def _hash_file(path: Path) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while block := fh.read(BLOCK):
            h.update(block)
            n += len(block)
    return h.hexdigest(), n


class ShardFileCache:
    """See the module doc. ``hits`` / ``fetched`` / ``hashed`` count what loads found and did."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root).expanduser() if root else default_cache_dir()
        self.hits = self.fetched = self.hashed = 0

    def path(self, storage: Any, key: str, sha256: str, size: int, *, verify_cached: bool = False) -> Path:
        """A local path holding ``key``'s bytes, checked to have ``sha256`` and ``size`` (now or when
        they were cached). Raises :class:`ChecksumError` when the store's file does not match."""
        if getattr(storage, "_local", False):
            return self._local(Path(storage.path(key)), key, sha256, size, verify_cached)
        target = self.root / "files" / sha256
        if target.is_file() and target.stat().st_size == size:
            if not verify_cached or _hash_file(target)[0] == sha256:
                self.hits += 1
                return target
            log.warning("shard cache: %s does not hold %s any more: fetching it again", target, key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{sha256[:16]}.", suffix=".part")
        try:
            h, n = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out, storage.open_read(key) as src:
                while block := src.read(BLOCK):
                    h.update(block)
                    n += len(block)
                    out.write(block)
            if h.hexdigest() != sha256 or n != size:
                raise ChecksumError(key, f"{sha256} ({size} bytes)", f"{h.hexdigest()} ({n} bytes)")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.fetched += 1
        return target

    def _local(self, path: Path, key: str, sha256: str, size: int, verify_cached: bool) -> Path:
        if not path.is_file():
            raise FileNotFoundError(f"{key} not found ({path})")
        st = path.stat()
        seen = {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        stamp = self.root / "stamps" / sha256
        try:
            if not verify_cached and json.loads(stamp.read_text()) == seen and st.st_size == size:
                self.hits += 1
                return path
        except (OSError, ValueError):
            pass
        actual, n = _hash_file(path)
        self.hashed += 1
        if actual != sha256 or n != size:
            raise ChecksumError(key, f"{sha256} ({size} bytes)", f"{actual} ({n} bytes)")
        try:  # a stamp that cannot be written only costs the next load a hash
            stamp.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=stamp.parent, prefix=f".{sha256[:16]}.", suffix=".part")
            with os.fdopen(fd, "w") as fh:
                json.dump(seen, fh)
            os.replace(tmp, stamp)
        except OSError as exc:
            log.warning("shard cache: could not write %s (%s)", stamp, exc)
        return path
