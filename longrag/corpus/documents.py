"""Load user corpora into :class:`Document` records, and convert documents to/from Arrow.

Sources: local files or ``s3://bucket/key`` objects (read through the artifact store's storage
layer, :func:`longrag.store.open_source`). JSONL (``.jsonl``/``.jsonl.gz``) and parquet with the fields ``doc_id`` (or ``id``),
``title``, ``text`` (or ``contents``) and optional ``links`` (a list of titles); MediaWiki XML
exports go through :mod:`longrag.corpus.wikitext`. DPR/Pyserini-style ``contents`` (``"Title"\\ntext``,
sometimes unquoted) give up their first line as the title when the record has no title field.

A bad record (invalid JSON, missing id or text, wrong types, duplicate id) never ends a read: it
is counted in a :class:`ReadReport` with its line (or row) number and the reason.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from longrag.corpus.report import ReadReport
from longrag.corpus.wikitext import read_wikixml
from longrag.types import Document

Format = Literal["wikixml", "jsonl", "parquet"]
FORMATS: tuple[str, ...] = ("wikixml", "jsonl", "parquet")

DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("links", pa.list_(pa.string()), nullable=False),
    ]
)


def split_dpr_contents(contents: str, max_title_chars: int = 256) -> tuple[str | None, str]:
    """DPR/Pyserini passages: ``'"Title"\\ntext'`` or ``'Title\\ntext'`` -> ``("Title", "text")``.
    Strings without a first line of at most ``max_title_chars`` -> ``(None, contents)``."""
    first, sep, rest = contents.partition("\n")
    first = first.strip()
    if not sep or not first or len(first) > max_title_chars or not rest.strip():
        return None, contents
    if len(first) >= 2 and first[0] == first[-1] == '"':
        first = first[1:-1].strip()
    return (first or None), rest


def record_to_document(rec: Any) -> Document:
    """Validate one JSON-like record and build a Document. Raises ValueError saying what is wrong."""
    if not isinstance(rec, dict):
        raise ValueError(f"record is a {type(rec).__name__}, not an object")
    doc_id = rec.get("doc_id", rec.get("id"))
    if doc_id is None or isinstance(doc_id, (dict, list, bool, float)) or str(doc_id).strip() == "":
        raise ValueError("missing doc_id/id (a non-empty string or integer)")
    title = rec.get("title")
    if "text" in rec and rec["text"] is not None:
        text = rec["text"]
        from_contents = False
    else:
        text = rec.get("contents")
        from_contents = True
    if not isinstance(text, str) or not text.strip():
        raise ValueError("missing text/contents (a non-empty string)")
    if title is None:
        if from_contents:
            dpr_title, text = split_dpr_contents(text)
            title = dpr_title or ""
        else:
            title = ""
    if not isinstance(title, str):
        raise ValueError(f"title must be a string, got {type(title).__name__}")
    links = rec.get("links")
    if links is None:
        links = []
    if not isinstance(links, list) or not all(isinstance(t, str) for t in links):
        raise ValueError("links must be a list of strings")
    return Document(doc_id=str(doc_id).strip(), title=title.strip(), text=text.strip(), links=list(links))


class _Collector:
    """Turns records into documents, counting bad ones and duplicate ids."""

    def __init__(self, report: ReadReport) -> None:
        self.report = report
        self.docs: list[Document] = []
        self.first_line: dict[str, int] = {}

    def add(self, line: int, rec: Any) -> None:
        try:
            doc = record_to_document(rec)
        except ValueError as e:
            rid = rec.get("doc_id", rec.get("id")) if isinstance(rec, dict) else None
            self.report.add_bad(line, str(e), record=None if rid is None else str(rid))
            return
        if doc.doc_id in self.first_line:
            self.report.add_bad(line, f"duplicate doc_id (first at line {self.first_line[doc.doc_id]})", doc.doc_id)
            return
        self.first_line[doc.doc_id] = line
        self.docs.append(doc)
        self.report.n_ok += 1


def read_jsonl(path: str | Path, max_examples: int = 20) -> tuple[list[Document], ReadReport]:
    """Read a JSONL document file (optionally gzipped), local or ``s3://``. Blank lines are skipped
    (and counted in ``stats['blank_lines']``); every other line is a document or a counted bad record."""
    from longrag.store import open_source  # the storage layer reads local files and s3:// objects

    source = _source_str(path)
    report = ReadReport(source=source, fmt="jsonl", max_examples=max_examples)
    col = _Collector(report)
    blank = 0
    with open_source(source) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                blank += 1
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                report.add_bad(lineno, f"invalid JSON: {e.msg} (column {e.colno})")
                continue
            col.add(lineno, rec)
    report.stats["blank_lines"] = blank
    return col.docs, report


def read_parquet(path: str | Path, max_examples: int = 20, batch_size: int = 4096) -> tuple[list[Document], ReadReport]:
    """Read a parquet document file (local or ``s3://``) batch by batch; ``line`` in the report is
    the 1-based row."""
    source = _source_str(path)
    report = ReadReport(source=source, fmt="parquet", max_examples=max_examples)
    col = _Collector(report)
    for row, rec in parquet_rows(source, batch_size=batch_size):
        col.add(row, rec)
    return col.docs, report


PARQUET_COLUMNS = ("doc_id", "id", "title", "text", "contents", "links")
"""The columns a parquet document file may have (an id and a text column at least)."""


def parquet_rows(source: str, row_group: int | None = None, batch_size: int = 4096) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(1-based row, record without nulls)`` of a parquet document file (local or ``s3://``), of
    one ``row_group`` or all of them; a file without an id or a text column is a ValueError."""
    from longrag.store import open_source

    with open_source(source, seekable=True, decompress=False) as fh:
        pf = pq.ParquetFile(fh)
        names = set(pf.schema_arrow.names)
        if not ({"doc_id", "id"} & names) or not ({"text", "contents"} & names):
            raise ValueError(
                f"{source}: parquet documents need a doc_id (or id) and a text (or contents) column; "
                f"found {sorted(names)}"
            )
        wanted = [c for c in PARQUET_COLUMNS if c in names]
        groups = None if row_group is None else [row_group]
        row = 0 if row_group is None else sum(pf.metadata.row_group(i).num_rows for i in range(row_group))
        for batch in pf.iter_batches(batch_size=batch_size, columns=wanted, row_groups=groups):
            for rec in batch.to_pylist():
                row += 1
                yield row, {k: v for k, v in rec.items() if v is not None}


def _source_str(path: str | Path) -> str:
    """A source as a string: URIs (``s3://bucket/key``) must not go through ``Path``, which would
    fold their ``//``."""
    return path if isinstance(path, str) else str(path)


def read_documents(
    path: str | Path, fmt: Format | None = None, text_mode: Literal["full", "lead"] = "full"
) -> tuple[list[Document], ReadReport]:
    """Read documents from ``path`` in ``fmt`` (None: guessed from the file name). ``text_mode``
    applies to wiki exports only; ``"lead"`` on JSONL/parquet is an error (they carry no sections).
    ``path`` is a local file or an ``s3://bucket/key`` object (read through :mod:`longrag.store`)."""
    p = _source_str(path)
    if fmt is None:
        fmt = guess_format(p)
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if text_mode not in ("full", "lead"):
        raise ValueError(f"text_mode must be 'full' or 'lead', got {text_mode!r}")
    if fmt == "wikixml":
        return read_wikixml(p, text_mode=text_mode)
    if text_mode != "full":
        raise ValueError(
            f"text_mode={text_mode!r} needs wikitext sections; {fmt} documents are read as given "
            "(store lead sections as the text instead)"
        )
    return read_jsonl(p) if fmt == "jsonl" else read_parquet(p)


def guess_format(path: str | Path) -> Format:
    """Format from a file name: ``.xml[.bz2|.gz]`` -> wikixml, ``.jsonl[.gz]`` -> jsonl, ``.parquet``."""
    name = Path(path).name.lower()
    for suffix in (".bz2", ".gz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if name.endswith(".xml"):
        return "wikixml"
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    raise ValueError(f"cannot tell the format of {path}; pass fmt as one of {FORMATS}")


def documents_to_table(docs: Iterable[Document]) -> pa.Table:
    """Documents -> Arrow table with :data:`DOCUMENT_SCHEMA`."""
    cols: dict[str, list[Any]] = {"doc_id": [], "title": [], "text": [], "links": []}
    for d in docs:
        cols["doc_id"].append(d.doc_id)
        cols["title"].append(d.title)
        cols["text"].append(d.text)
        cols["links"].append(list(d.links))
    return pa.Table.from_pydict(cols, schema=DOCUMENT_SCHEMA)
