"""The benchmark jobs' tables: records as Markdown, ready to paste into docs/."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def cell(value: Any) -> str:
    """Integers with thousands separators, anything else as ``str``."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]], cols: Sequence[str], missing: str = "-") -> str:
    """``rows`` (records) as a Markdown table of ``cols``; a record without a column shows ``missing``."""
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(cell(r[c]) if c in r else missing for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def publish(out: str | Path, table: str, summary: Mapping[str, Any]) -> None:
    """Print ``table`` and ``summary`` (one JSON line, last) and write them to ``out``/table.md and summary.json."""
    print(table)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.md").write_text(table + "\n")
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
