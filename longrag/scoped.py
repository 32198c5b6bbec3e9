"""Settings changed for a ``with`` block and restored after, even when the block raises:
environment variables a process started inside inherits (a local Ray, the autoscaler), and an
attribute of a shared object (e.g. a Ray Data ``DataContext`` field for one read)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

_MISSING = object()


@contextmanager
def environ(updates: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``updates`` inside the block; each variable's old value (or its absence)
    is restored after."""
    old = {k: os.environ.get(k, _MISSING) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is _MISSING:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v  # type: ignore[assignment]


@contextmanager
def attribute(obj: Any, name: str, value: Any) -> Iterator[None]:
    """``obj.name = value`` inside the block, the old value restored after."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)
