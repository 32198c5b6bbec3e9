"""Sources of a corpus split into independent read tasks, for a build that parses in parallel.

A corpus is one or many files, local or ``s3://`` (a folder or an ``s3://bucket/prefix/`` takes every
file in it of the chosen format). :func:`plan_read_tasks` splits them into :class:`ReadTask` items
that can be read and parsed on different workers:

- JSONL: one task per file;
- parquet: one task per row group;
- a MediaWiki XML export compressed as a *multistream* bz2 (``pages-articles-multistream.xml.bz2``)
  with its index (``...-multistream-index.txt.bz2`` beside it, lines ``offset:page_id:title``): one task
  per bz2 stream (about 100 pages each), decompressed on its own from its byte range; any other
  export: one task per file.

:func:`read_task_records` turns one task into parsed :class:`TaskRecord` items (documents,
redirects, bad records with their line or row), so a worker never needs another task's data.
:func:`write_multistream` re-packs an export as a multistream dump with its index (tests, benchmarks).
Nothing here imports Ray.
"""

from __future__ import annotations

import bz2
import io
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from longrag.types import Document

if TYPE_CHECKING:
    from longrag.corpus.wikixml import RawPage

TaskKind = Literal["file", "stream", "row_group"]

_SUFFIXES = {
    "wikixml": (".xml", ".xml.bz2", ".xml.gz"),
    "jsonl": (".jsonl", ".jsonl.gz", ".ndjson"),
    "parquet": (".parquet", ".pq"),
}


@dataclass(frozen=True)
class ReadTask:
    """One independently readable piece of a corpus: a whole ``file``, a bz2 ``stream`` of a
    multistream dump (bytes ``start``..``end``, ``end`` -1 = end of file), or a parquet ``row_group``."""

    task_id: int
    source: str
    fmt: str
    kind: TaskKind = "file"
    start: int = 0
    end: int = -1
    row_group: int = -1


@dataclass
class TaskRecord:
    """What reading a task yields, in source order: a ``doc``, a ``redirect`` (wiki exports:
    ``title`` -> ``target``, both normalized) or a ``bad`` record (``line``: 1-based JSONL line or
    parquet row of the file; ``record``: its id or title when known; ``title``: a wiki page's title)."""

    kind: Literal["doc", "redirect", "bad"]
    doc: Document | None = None
    title: str = ""
    target: str = ""
    line: int | None = None
    reason: str = ""
    record: str | None = None


# ---------------------------------------------------------------------------------------- sources
def _has_suffix(name: str, fmt: str) -> bool:
    return name.lower().endswith(_SUFFIXES[fmt])


def expand_sources(sources: str | Sequence[str], fmt: str) -> list[str]:
    """Files of ``sources``, in the order given (a folder or ``s3://bucket/prefix/`` becomes its files
    of format ``fmt``, sorted; multistream index files are left out). Raises ValueError for an
    unknown format, FileNotFoundError for a missing file or a folder without files of the format."""
    from longrag.store import open_storage

    if fmt not in _SUFFIXES:
        raise ValueError(f"fmt must be one of {sorted(_SUFFIXES)}, got {fmt!r}")
    items = [sources] if isinstance(sources, str) else list(sources)
    if not items:
        raise ValueError("no source given")
    out: list[str] = []
    for src in items:
        text = str(src)
        is_dir = text.endswith("/") if text.startswith("s3://") else Path(text.removeprefix("file://")).is_dir()
        if not is_dir:
            if not text.startswith("s3://") and not Path(text.removeprefix("file://")).exists():
                raise FileNotFoundError(f"source not found: {text}")
            out.append(text)
            continue
        storage = open_storage(text)
        names = sorted(k for k in storage.list("") if _has_suffix(k, fmt) and "multistream-index" not in k)
        if not names:
            raise FileNotFoundError(f"{text} holds no {fmt} files ({', '.join(_SUFFIXES[fmt])})")
        base = text if text.endswith("/") else text + "/"
        out.extend(base + k for k in names)
    return out


def multistream_index_for(source: str) -> str | None:
    """The index of a multistream dump (``X-multistream.xml.bz2`` -> ``X-multistream-index.txt.bz2``)
    when it exists beside it, else None."""
    from longrag.store import source_location

    if not source.endswith("multistream.xml.bz2"):
        return None
    candidate = source[: -len(".xml.bz2")] + "-index.txt.bz2"
    storage, key = source_location(candidate)
    return candidate if storage.exists(key) else None


def stream_offsets(index_source: str) -> list[int]:
    """Distinct byte offsets of the bz2 streams that hold pages, increasing, from a multistream index."""
    from longrag.store import open_source

    offsets: set[int] = set()
    with open_source(index_source) as fh:
        for lineno, line in enumerate(io.TextIOWrapper(fh, encoding="utf-8"), start=1):
            head, sep, _ = line.partition(":")
            if not line.strip():
                continue
            if not sep or not head.isdigit():
                raise ValueError(f"{index_source} line {lineno}: expected 'offset:page_id:title', got {line[:80]!r}")
            offsets.add(int(head))
    return sorted(offsets)


def plan_read_tasks(sources: str | Sequence[str], fmt: str) -> list[ReadTask]:
    """Split ``sources`` into independent read tasks (see the module docstring), numbered in order."""
    tasks: list[ReadTask] = []
    for src in expand_sources(sources, fmt):
        if fmt == "wikixml" and (index := multistream_index_for(src)):
            offsets = stream_offsets(index)
            # streams run from one offset to the next; the last one ends with the file (its footer)
            for a, b in zip(offsets, [*offsets[1:], -1]):
                tasks.append(ReadTask(len(tasks), src, fmt, "stream", a, b))
        elif fmt == "parquet":
            for rg in range(_row_groups(src)):
                tasks.append(ReadTask(len(tasks), src, fmt, "row_group", row_group=rg))
        else:
            tasks.append(ReadTask(len(tasks), src, fmt))
    return tasks


def _row_groups(source: str) -> int:
    import pyarrow.parquet as pq

    from longrag.store import open_source

    with open_source(source, seekable=True, decompress=False) as fh:
        return pq.ParquetFile(fh).metadata.num_row_groups


# ---------------------------------------------------------------------------------------- reading
def read_task_records(task: ReadTask, text_mode: str = "full") -> Iterator[TaskRecord]:
    """Parse one read task: wiki pages through :func:`longrag.corpus.wikitext.try_parse_page`
    (``text_mode`` lead or full), JSONL/parquet records through
    :func:`longrag.corpus.documents.record_to_document` (``text_mode`` must be full)."""
    if task.fmt == "wikixml":
        yield from _wiki_records(task, text_mode)
        return
    if text_mode != "full":
        raise ValueError(f"units.text_mode={text_mode!r} needs sections: it applies to --format wikixml only")
    if task.fmt == "jsonl":
        yield from _jsonl_records(task)
    elif task.fmt == "parquet":
        yield from _parquet_records(task)
    else:
        raise ValueError(f"fmt must be one of {sorted(_SUFFIXES)}, got {task.fmt!r}")


def _record(line: int, rec: object) -> TaskRecord:
    from longrag.corpus.documents import record_to_document

    try:
        return TaskRecord("doc", doc=record_to_document(rec))
    except ValueError as e:
        rid = rec.get("doc_id", rec.get("id")) if isinstance(rec, dict) else None
        return TaskRecord("bad", line=line, reason=str(e), record=None if rid is None else str(rid))


def _jsonl_records(task: ReadTask) -> Iterator[TaskRecord]:
    from longrag.store import open_source

    with open_source(task.source) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                yield TaskRecord("bad", line=lineno, reason=f"invalid JSON: {e.msg} (column {e.colno})")
                continue
            yield _record(lineno, rec)


def _parquet_records(task: ReadTask) -> Iterator[TaskRecord]:
    from longrag.corpus.documents import parquet_rows

    for row, rec in parquet_rows(task.source, row_group=task.row_group):
        yield _record(row, rec)


def _wiki_records(task: ReadTask, text_mode: str) -> Iterator[TaskRecord]:
    from longrag.corpus import wikitext
    from longrag.corpus.wikititles import normalize_title

    for raw in _task_pages(task):
        if raw.redirect:
            yield TaskRecord("redirect", title=normalize_title(raw.title), target=raw.redirect)
            continue
        doc, reason = wikitext.try_parse_page(raw, text_mode=text_mode)
        if doc is None:
            yield TaskRecord("bad", title=raw.title, reason=reason or "unknown", record=raw.page_id or raw.title)
        else:
            yield TaskRecord("doc", doc=doc)


def _task_pages(task: ReadTask) -> Iterator[RawPage]:
    from longrag.corpus import wikixml
    from longrag.store import open_source

    if task.kind != "stream":
        yield from wikixml.iter_pages(task.source)
        return
    with open_source(task.source, seekable=True, decompress=False) as fh:
        fh.seek(task.start)
        data = fh.read() if task.end < 0 else fh.read(task.end - task.start)
    xml = bz2.decompress(data)
    if b"<page" not in xml:  # the header (siteinfo) or footer stream
        return
    # a stream holds whole <page> elements without the root: wrap them so they parse on their own
    head, body = xml.find(b"<mediawiki"), xml
    if head >= 0:  # the first stream of a dump also carries the root's start tag
        body = xml[xml.index(b">", head) + 1 :]
    body = body.replace(b"</mediawiki>", b"")
    yield from wikixml.iter_pages(io.BytesIO(b"<mediawiki>" + body + b"</mediawiki>"))


# ---------------------------------------------------------------------------------------- writing
def write_multistream(source: str | Path, out: str | Path, pages_per_stream: int = 100) -> tuple[Path, Path]:
    """Re-pack a MediaWiki XML export as a multistream bz2 dump plus its index, the layout of
    ``pages-articles-multistream.xml.bz2``: a header stream (everything before the first page), one
    stream per ``pages_per_stream`` pages, a footer stream. ``out`` is the dump's path, ending in
    ``multistream.xml.bz2``; returns ``(dump, index)``."""
    from longrag.store import open_source

    out = Path(out)
    if not out.name.endswith("multistream.xml.bz2"):
        raise ValueError(f"a multistream dump's name ends in 'multistream.xml.bz2', got {out.name!r}")
    with open_source(str(source)) as fh:
        xml = fh.read()
    first = xml.find(b"<page>")
    if first < 0:
        raise ValueError(f"{source} holds no <page> elements")
    end_tag = b"</page>"
    pages: list[bytes] = []
    pos = first
    while True:
        start = xml.find(b"<page>", pos)
        if start < 0:
            break
        stop = xml.index(end_tag, start) + len(end_tag)
        pages.append(xml[start:stop])
        pos = stop
    header, footer = xml[:first], xml[pos:]
    index_lines: list[str] = []
    with open(out, "wb") as dump:
        dump.write(bz2.compress(header))
        for i in range(0, len(pages), pages_per_stream):
            offset = dump.tell()
            group = pages[i : i + pages_per_stream]
            for page in group:
                el = ET.fromstring(page)
                title = el.findtext("title") or ""
                page_id = el.findtext("id") or ""
                index_lines.append(f"{offset}:{page_id}:{title}")
            dump.write(bz2.compress(b"\n".join(group) + b"\n"))
        dump.write(bz2.compress(footer))
    index = out.with_name(out.name[: -len(".xml.bz2")] + "-index.txt.bz2")
    index.write_bytes(bz2.compress(("\n".join(index_lines) + "\n").encode("utf-8")))
    return out, index

