"""Reader checkpoints: an evaluation that dies part-way keeps the answers it already has.

Reading is the slow part of an evaluation (tens of seconds per question on a CPU, hours for a
set). :class:`ReaderCheckpoint` appends each question's reader output to a JSONL file as soon as it
exists; a rerun with the same inputs takes those answers from the file and reads only the rest.
An entry is reused only when its key matches: the question id and text, the ids of the units
given to the reader, and a digest of the reader setup (LLM and reader config). A torn last line
(the crash) is cut off and counted, not fatal.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from longrag.journal import JsonlJournal


def setup_digest(setup: Mapping[str, Any]) -> str:
    """A short digest of what decides the reader's output (model, prompts, limits)."""
    return hashlib.sha256(json.dumps(setup, sort_keys=True, default=str).encode()).hexdigest()[:16]


def entry_key(qid: str, question: str, unit_ids: Sequence[str], setup: str) -> str:
    blob = json.dumps([qid, question, list(unit_ids), setup], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class ReaderCheckpoint:
    """Append-only JSONL of ``{"key", "qid", "reader"}`` records at ``path``
    (a :class:`longrag.journal.JsonlJournal`)."""

    def __init__(self, path: str | Path, setup: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.setup = setup_digest(setup)
        self._journal = JsonlJournal(self.path, parse=_entry)
        self.entries: dict[str, dict[str, Any]] = dict(self._journal.records)
        self.torn = self._journal.bad_lines

    def key(self, qid: str, question: str, unit_ids: Sequence[str]) -> str:
        return entry_key(qid, question, unit_ids, self.setup)

    def get(self, qid: str, question: str, unit_ids: Sequence[str]) -> dict[str, Any] | None:
        return self.entries.get(self.key(qid, question, unit_ids))

    def add(self, qid: str, question: str, unit_ids: Sequence[str], reader: Mapping[str, Any]) -> None:
        """Record one answer (fsynced at once, so a crash loses at most the answer being read)."""
        key = self.key(qid, question, unit_ids)
        self._journal.append({"key": key, "qid": qid, "reader": dict(reader)})
        self.entries[key] = dict(reader)

    def remove(self) -> None:
        """Delete the file (the run it served is complete and written)."""
        self._journal.remove()


def _entry(line: str) -> tuple[str, dict[str, Any]]:
    rec = json.loads(line)
    return str(rec["key"]), dict(rec["reader"])
