"""Reader checkpoints: an evaluation that dies part-way keeps the answers it already has.

Reading is the slow part of an evaluation (tens of seconds per question on a CPU, hours for a
set). :class:`ReaderCheckpoint` appends each question's reader output to a JSONL file as soon as it
exists; a rerun with the same inputs takes those answers from the file and reads only the rest.
An entry is reused only when its key matches: the question id and text, the ids of the units
given to the reader, and a digest of the reader setup (LLM and reader config). A torn last line
(the crash) is skipped, not fatal.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

log = logging.getLogger(__name__)


def setup_digest(setup: Mapping[str, Any]) -> str:
    """A short digest of what decides the reader's output (model, prompts, limits)."""
    return hashlib.sha256(json.dumps(setup, sort_keys=True, default=str).encode()).hexdigest()[:16]


def entry_key(qid: str, question: str, unit_ids: Sequence[str], setup: str) -> str:
    blob = json.dumps([qid, question, list(unit_ids), setup], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class ReaderCheckpoint:
    """Append-only JSONL of ``{"key", "qid", "reader"}`` records at ``path``."""

    def __init__(self, path: str | Path, setup: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.setup = setup_digest(setup)
        self._lock = threading.Lock()
        self.entries: dict[str, dict[str, Any]] = {}
        self.torn = 0
        self._newline_first = False  # a torn last line has no newline: the next record starts one
        if self.path.is_file():
            with open(self.path, "rb") as fb:
                fb.seek(0, 2)
                if fb.tell():
                    fb.seek(-1, 2)
                    self._newline_first = fb.read(1) != b"\n"
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                        self.entries[str(rec["key"])] = dict(rec["reader"])
                    except (ValueError, KeyError, TypeError):
                        self.torn += 1
            if self.torn:
                log.warning("%s: %d unreadable line(s) skipped (an interrupted write)", self.path, self.torn)

    def key(self, qid: str, question: str, unit_ids: Sequence[str]) -> str:
        return entry_key(qid, question, unit_ids, self.setup)

    def get(self, qid: str, question: str, unit_ids: Sequence[str]) -> dict[str, Any] | None:
        return self.entries.get(self.key(qid, question, unit_ids))

    def add(self, qid: str, question: str, unit_ids: Sequence[str], reader: Mapping[str, Any]) -> None:
        """Record one answer (flushed at once, so a crash loses at most the answer being read)."""
        key = self.key(qid, question, unit_ids)
        line = json.dumps({"key": key, "qid": qid, "reader": dict(reader)}, ensure_ascii=False, default=str)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(("\n" if self._newline_first else "") + line + "\n")
                fh.flush()
            self._newline_first = False
            self.entries[key] = dict(reader)

    def remove(self) -> None:
        """Delete the file (the run it served is complete and written)."""
        self.path.unlink(missing_ok=True)
