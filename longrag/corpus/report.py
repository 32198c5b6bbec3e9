"""What reading a corpus produced: good and bad record counts, with up to ``max_examples`` bad
records (line or row number and reason). Shared by every reader in :mod:`longrag.corpus`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class BadRecord:
    """One record that could not become a document. ``line`` is the 1-based JSONL line or the
    1-based parquet row; ``record`` is its id or title when known."""

    line: int | None
    reason: str
    record: str | None = None


@dataclass
class ReadReport:
    """What a read produced: good and bad record counts, up to ``max_examples`` bad records,
    and format-specific ``stats`` (e.g. redirects and link counts for wiki exports)."""

    source: str
    fmt: str
    n_ok: int = 0
    n_bad: int = 0
    bad: list[BadRecord] = field(default_factory=list)
    max_examples: int = 20
    stats: dict[str, Any] = field(default_factory=dict)

    def add_bad(self, line: int | None, reason: str, record: str | None = None) -> None:
        self.n_bad += 1
        if len(self.bad) < self.max_examples:
            self.bad.append(BadRecord(line=line, reason=reason, record=record))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        head = f"{self.source} ({self.fmt}): {self.n_ok} documents, {self.n_bad} bad"
        lines = [head] + [
            f"  {'line ' + str(b.line) if b.line is not None else (b.record or '?')}: {b.reason}" for b in self.bad
        ]
        if self.n_bad > len(self.bad):
            lines.append(f"  ... and {self.n_bad - len(self.bad)} more")
        return "\n".join(lines)
