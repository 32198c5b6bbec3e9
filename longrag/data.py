"""Where the bundled data lives, and how to read it.

The repository ships small samples of the evaluation sets and the generators' inputs in its
``data/`` folder; ``data/README.md`` lists every file with its source, licence and attribution.
This module is the one place that knows where that folder is: ``$LONGRAG_DATA_DIR`` when set (a
folder with the same layout), otherwise the ``data/`` folder of the repository this package lives
in (a source checkout or an editable install; the data is not part of a built wheel).

Large JSON files ship gzip-compressed; :func:`open_text` reads plain, ``.gz`` and ``.bz2`` files
alike, and the dataset loaders use it, so a ``.json.gz`` path works wherever a ``.json`` one does.
"""

from __future__ import annotations

import bz2
import gzip
import io
import os
from pathlib import Path

__all__ = [
    "DATA_DIR_ENV",
    "REPO_DATA_DIR",
    "DataNotFoundError",
    "data_dir",
    "data_path",
    "open_text",
    "read_text",
    "SAMPLE_WIKI",
    "HOTPOTQA_SAMPLE",
    "HOTPOTQA_CORPUS",
    "MUSIQUE_SAMPLE",
    "MUSIQUE_CORPUS",
    "TWOWIKI_EXAMPLE",
    "NQ_OPEN_SAMPLE",
    "DPR_PASSAGES",
    "BABI_DIR",
    "WORDLISTS_DIR",
    "RULER_TASKS_YAML",
]

DATA_DIR_ENV = "LONGRAG_DATA_DIR"
# longrag/ sits at the repository root, next to data/.
REPO_DATA_DIR = Path(__file__).resolve().parent.parent / "data"

# The bundled files, relative to the data folder (one name per file, used by the generators, the
# tests and the README's commands).
SAMPLE_WIKI = "sample/enwiki-sample-106-articles.xml.bz2"
HOTPOTQA_SAMPLE = "hotpotqa/hotpotqa_train100.json.gz"
HOTPOTQA_CORPUS = "hotpotqa/hotpotqa_train100_corpus.json.gz"
MUSIQUE_SAMPLE = "musique/musique_train100.json.gz"
MUSIQUE_CORPUS = "musique/musique_train100_corpus.json.gz"
TWOWIKI_EXAMPLE = "2wikimultihopqa/2wiki_format_example2.json"
NQ_OPEN_SAMPLE = "nq_open/NQ-open.efficientqa.dev.1.1.jsonl.gz"
DPR_PASSAGES = "dpr_wiki/wiki_dpr_sample1000.jsonl.gz"
BABI_DIR = "babi"
WORDLISTS_DIR = "wordlists"
RULER_TASKS_YAML = "ruler/ruler_synthetic.yaml"


class DataNotFoundError(FileNotFoundError):
    """The data folder, or a file that should be in it, is missing."""


def data_dir() -> Path:
    """The data folder: ``$LONGRAG_DATA_DIR`` if set, else the repository's ``data/``."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        p = Path(override).expanduser()
        if not p.is_dir():
            raise DataNotFoundError(
                f"{DATA_DIR_ENV}={override!r} is not a folder; unset it to use the bundled data in "
                f"{REPO_DATA_DIR}, or point it at a folder with the same layout"
            )
        return p
    if not REPO_DATA_DIR.is_dir():
        raise DataNotFoundError(
            f"the bundled data folder {REPO_DATA_DIR} is missing: the package is not running from a "
            f"checkout of the repository (data/ ships with the source, not in the wheel); clone the "
            f"repository, or set {DATA_DIR_ENV} to a copy of its data/ folder"
        )
    return REPO_DATA_DIR


def data_path(*parts: str) -> Path:
    """A file or folder under :func:`data_dir`; raises :class:`DataNotFoundError` naming the path
    and the data folder when it is missing."""
    base = data_dir()
    p = base.joinpath(*parts)
    if not p.exists():
        rel = "/".join(parts)
        raise DataNotFoundError(
            f"{rel!r} not found in the data folder {base} (see data/README.md for the bundled files"
            + (f"; {DATA_DIR_ENV} is set" if os.environ.get(DATA_DIR_ENV) else "")
            + ")"
        )
    return p


def open_text(path: str | Path, errors: str = "strict") -> io.TextIOBase:
    """Open a UTF-8 text file for reading, decompressing ``.gz`` and ``.bz2`` by suffix."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".gz":
        return gzip.open(p, "rt", encoding="utf-8", errors=errors)
    if suffix == ".bz2":
        return bz2.open(p, "rt", encoding="utf-8", errors=errors)
    return open(p, encoding="utf-8", errors=errors)


def read_text(path: str | Path) -> str:
    """The whole text of a plain, ``.gz`` or ``.bz2`` file."""
    with open_text(path) as fh:
        return fh.read()
