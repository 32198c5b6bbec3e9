"""The two ends of every plot the jobs write (PNG files, no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["pyplot", "save_figure"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend: files only, no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, *, dpi: int = 110, title: str | None = None, title_size: int = 9) -> Path:
    """``fig`` with its ``title`` (if any) laid out tight, written to ``path`` (its folder made) and
    closed; returns the path."""
    if title:
        fig.suptitle(title, fontsize=title_size)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
