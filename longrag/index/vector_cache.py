"""An on-disk cache of passage vectors, so that rerunning an evaluation does not encode an unchanged
corpus again (``embedding.vector_cache``; the evaluation jobs turn it on, index builds do not use it).

A vector is found by two keys:

* the **settings** of the encoder that made it (:func:`cache_settings`): the model's identity (for a model
  fetched and verified by :mod:`longrag.models.fetched`, its pinned manifest digest; for a local folder such as
  the bundled MiniLM, the sha256 of its config files and the sizes of its weight files; for a hub name, its
  snapshot), the dtype, ``quantize`` and ``backend``, the device type, the document prompt, the input limit,
  the dimension and ``normalize``. Any other value is another cache file;
* the **text**: the sha256 of the passage as given to ``encode_passages`` (before the prompt is prepended).

Storage: one SQLite file per settings (stdlib ``sqlite3``) under ``embedding.vector_cache_dir``, default
``$LONGRAG_MODEL_CACHE/vectors`` (``~/.cache/longrag/models/vectors``), named by the settings' sha256; a table
of ``text sha256 -> float32 bytes, sha256 of those bytes`` and the settings themselves in a second table. A
row whose length or checksum is wrong is a miss and is written again; a file SQLite cannot read (or whose
settings differ) is deleted and started again. There is no size budget: clear it by deleting the folder (or
one file). SQLite's locking lets several processes share it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = 1
"""Bump when what a cached vector means changes (e.g. how the Embedder post-processes vectors)."""
log = logging.getLogger(__name__)
LOOKUP_BATCH = 500  # SQLite's default limit on bound parameters is far above this


def default_cache_dir() -> Path:
    """``$LONGRAG_MODEL_CACHE/vectors`` (default ``~/.cache/longrag/models/vectors``)."""
    from longrag.models.bundled import model_cache_dir

    return model_cache_dir() / "vectors"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_identity(spec: Any) -> dict[str, Any]:
    """What identifies a model's weights without hashing them all (see the module's docstring)."""
    from longrag.models.fetched import FETCHED_MODELS

    if spec.name in FETCHED_MODELS:  # resolved only once verified against this manifest
        return {"name": spec.name, "manifest_sha256": FETCHED_MODELS[spec.name].manifest_sha256}
    folder = Path(spec.path_or_name).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(spec.path_or_name, local_files_only=True))
        except Exception:  # noqa: BLE001 - not a folder here: the name alone
            return {"name": spec.name}
    configs = {p.relative_to(folder).as_posix(): _sha256(p.read_bytes())
               for p in sorted(folder.rglob("*.json")) if p.stat().st_size < 1 << 20}
    weights = {p.relative_to(folder).as_posix(): p.stat().st_size
               for p in sorted(folder.rglob("*")) if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file()}
    return {"name": spec.name, "configs": configs, "weights_bytes": weights}


def cache_settings(embedder: Any) -> dict[str, Any]:
    """The settings that decide a loaded :class:`longrag.index.embedding.Embedder`'s passage vectors."""
    config = embedder.config
    return {"schema": SCHEMA, "model": model_identity(embedder.spec), "dtype": embedder.dtype,
            "quantize": config.quantize, "backend": config.backend, "device": str(embedder.device).split(":")[0],
            "document_prompt": embedder.document_instruction, "max_seq_length": embedder.max_seq_length,
            "dim": embedder.dim, "normalize": config.normalize}


def text_key(text: str) -> str:
    return _sha256(text.encode("utf-8", "surrogatepass"))


class VectorCache:
    """The vectors of one encoder setting (``settings``) in ``folder``; :meth:`encode` returns cached rows
    and encodes the others. ``hits``/``misses`` count texts looked up."""

    def __init__(self, folder: str | Path, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.dim = int(settings["dim"])
        blob = json.dumps(settings, sort_keys=True)
        self.path = Path(folder).expanduser() / f"{_sha256(blob.encode())[:32]}.sqlite"
        self._settings_json = blob
        self.hits = self.misses = 0
        self.lock_timeout_s = 60.0  # how long to wait for another process' write before a miss

    @classmethod
    def for_embedder(cls, embedder: Any) -> VectorCache:
        folder = embedder.config.vector_cache_dir or default_cache_dir()
        return cls(folder, cache_settings(embedder))

    # ------------------------------------------------------------------------------ storage

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=self.lock_timeout_s)
        con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        con.execute("CREATE TABLE IF NOT EXISTS vectors (text_sha TEXT PRIMARY KEY, vec BLOB NOT NULL, "
                    "vec_sha TEXT NOT NULL)")
        row = con.execute("SELECT value FROM meta WHERE key = 'settings'").fetchone()
        if row is None:
            con.execute("INSERT OR REPLACE INTO meta VALUES ('settings', ?)", (self._settings_json,))
            con.commit()
        elif row[0] != self._settings_json:
            con.close()
            raise sqlite3.DatabaseError(f"{self.path} holds other settings")
        return con

    def _open(self) -> sqlite3.Connection:
        """The cache file, started again when SQLite cannot read it (a corrupted or foreign file).
        A file another process holds locked past the timeout (several embedding actors of one build
        share it) raises ``sqlite3.OperationalError``: a miss for this batch, never a reason to delete
        what the other process is writing."""
        try:
            con = self._connect()
            con.execute("SELECT count(*) FROM vectors").fetchone()
            return con
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError:
            self.clear()
            return self._connect()

    def clear(self) -> None:
        """Delete this setting's file (and SQLite's side files)."""
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def _lookup(self, con: sqlite3.Connection, keys: list[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        for lo in range(0, len(keys), LOOKUP_BATCH):
            part = keys[lo:lo + LOOKUP_BATCH]
            rows = con.execute(f"SELECT text_sha, vec, vec_sha FROM vectors WHERE text_sha IN "
                               f"({','.join('?' * len(part))})", part).fetchall()
            for key, vec, vec_sha in rows:
                if len(vec) == 4 * self.dim and _sha256(vec) == vec_sha:  # else a miss, written again
                    found[key] = np.frombuffer(vec, dtype=np.float32)
        return found

    # ------------------------------------------------------------------------------ use

    def encode(self, texts: Sequence[str], encode: Callable[[list[str]], np.ndarray]) -> np.ndarray:
        """float32 ``(len(texts), dim)``: cached rows as stored, the others from ``encode(missing texts)``
        (each distinct text once), which are then stored. A cache that cannot be read or written is a miss
        (logged), never an error."""
        texts = list(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        keys = [text_key(t) for t in texts]
        con, found = None, {}
        try:
            con = self._open()
            found = self._lookup(con, list(dict.fromkeys(keys)))
        except (sqlite3.DatabaseError, OSError) as exc:  # locked, damaged while open, or no room: encode them all
            log.warning("vector cache %s unreadable (%s): encoding without it", self.path, exc)
            if con is not None:
                con.close()
            con, found = None, {}
            if not isinstance(exc, sqlite3.OperationalError):  # locked by another process: leave its file be
                self.clear()
        try:
            todo = list(dict.fromkeys(k for k in keys if k not in found))
            n_hit = sum(k in found for k in keys)
            self.hits, self.misses = self.hits + n_hit, self.misses + len(keys) - n_hit
            if todo:
                first = {k: i for i, k in reversed(list(enumerate(keys)))}
                vectors = np.ascontiguousarray(encode([texts[first[k]] for k in todo]), dtype=np.float32)
                if vectors.shape != (len(todo), self.dim):
                    raise RuntimeError(f"encoder returned {vectors.shape}, expected {(len(todo), self.dim)}")
                found.update(zip(todo, vectors))
                self._store(con, [(k, found[k].tobytes()) for k in todo])
            for i, k in enumerate(keys):
                out[i] = found[k]
            return out
        finally:
            if con is not None:
                con.close()

    def _store(self, con: sqlite3.Connection | None, rows: list[tuple[str, bytes]]) -> None:
        own = con is None
        try:
            con = self._open() if own else con
            con.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)", [(k, b, _sha256(b)) for k, b in rows])
            con.commit()
        except (sqlite3.DatabaseError, OSError) as exc:  # a cache that cannot be written is only slower
            log.warning("vector cache %s not written (%s)", self.path, exc)
        finally:
            if own and con is not None:
                con.close()
