"""One append-only JSONL journal: the checkpoint that lets a long run resume where it stopped.

The evaluation's reader checkpoint, the reader benchmark's rows and the LRGinstruction teacher's
replies all write one JSON record per line as each result exists (flushed and fsynced, so a crash
loses at most the record being written) and read them back on the next run. A process killed while
writing leaves a torn last line: opening the journal cuts it off, so the next record starts on a
line of its own, and counts it with any other unreadable line in :attr:`JsonlJournal.bad_lines`.

Hand-written because it is this small: ``jsonlines`` reads and writes lines but neither repairs a
torn tail nor fsyncs.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

UNREADABLE = (ValueError, KeyError, TypeError)
"""What a ``parse`` function may raise for a line it cannot read (counted, skipped)."""


class JsonlJournal(Generic[T]):
    """The records at ``path`` (each line through ``parse``; :data:`UNREADABLE` errors are counted
    in :attr:`bad_lines` and skipped) and :meth:`append` for new ones. Thread-safe appends."""

    def __init__(self, path: str | Path, parse: Callable[[str], T] = json.loads) -> None:
        self.path = Path(path)
        self.records: list[T] = []
        self.bad_lines = 0
        self._lock = threading.Lock()
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a line torn by a crash: cut it off so the next append starts clean
            self.bad_lines += 1
            with open(self.path, "r+b") as fh:
                fh.truncate(end)
        for line in data[:end].decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                self.records.append(parse(line))
            except UNREADABLE:
                self.bad_lines += 1
        if self.bad_lines:
            log.warning("%s: %d unreadable line(s) skipped (an interrupted write)", self.path, self.bad_lines)

    def append(self, record: str | Mapping[str, Any]) -> None:
        """Write one record (a JSON string, or a mapping dumped here) as a line, flushed and fsynced."""
        line = record if isinstance(record, str) else json.dumps(record, ensure_ascii=False, default=str)
        if "\n" in line:
            raise ValueError("a journal record must be one line of JSON")
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def remove(self) -> None:
        """Delete the file (the run it served is complete and written)."""
        self.path.unlink(missing_ok=True)
