"""Streaming a MediaWiki XML export (``.xml``, ``.xml.bz2``, ``.xml.gz``, local or on S3) into
cheap :class:`RawPage` records: each page's title, namespace, id, redirect target and raw wikitext,
with ``xml.etree.ElementTree.iterparse`` and element clearing so memory stays flat.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from longrag.corpus.wikititles import normalize_title

_REDIRECT_TEXT = re.compile(r"^\s*#redirect\s*:?\s*\[\[([^\]|]+)", re.IGNORECASE)


@dataclass
class RawPage:
    """One page of the export, unparsed. ``redirect`` is the normalized target title of a
    redirect page (anchor dropped), else None."""

    title: str
    ns: int
    page_id: str
    redirect: str | None
    wikitext: str

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RawPage:
        redirect = row.get("redirect")
        return cls(
            title=str(row["title"]),
            ns=int(row["ns"]),
            page_id=str(row["page_id"]),
            redirect=None if redirect is None else str(redirect),
            wikitext=str(row.get("wikitext") or ""),
        )


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(el: ET.Element, name: str) -> ET.Element | None:
    for c in el:
        if _local(c.tag) == name:
            return c
    return None


def _page_from_element(page: ET.Element) -> RawPage:
    title_el, ns_el, id_el = _child(page, "title"), _child(page, "ns"), _child(page, "id")
    title = (title_el.text or "") if title_el is not None else ""
    ns = int((ns_el.text or "0").strip()) if ns_el is not None else 0
    page_id = (id_el.text or "").strip() if id_el is not None else ""
    text = ""
    for rev in page:  # the last revision holds the current text
        if _local(rev.tag) == "revision":
            text_el = _child(rev, "text")
            text = (text_el.text or "") if text_el is not None else ""
    redirect = None
    red_el = _child(page, "redirect")
    target = red_el.get("title") if red_el is not None else None
    if target is None:
        m = _REDIRECT_TEXT.match(text)
        target = m.group(1) if m else None
    if target is not None or red_el is not None:
        t = html.unescape(target or "").lstrip(":").split("#", 1)[0]
        redirect = normalize_title(t)
    return RawPage(title=title, ns=ns, page_id=page_id, redirect=redirect, wikitext=text)


def iter_pages(path: str | Path | IO[bytes], namespaces: Iterable[int] = (0,)) -> Iterator[RawPage]:
    """Stream the pages of a MediaWiki XML export whose namespace is in ``namespaces`` (default:
    main-namespace articles and redirects). Works for any export schema version.

    ``path`` is a binary file object, a local file or an ``s3://bucket/key`` object (``.bz2``/``.gz``
    decompressed on the fly, S3 bodies streamed; see :func:`longrag.store.open_source`).
    Raises ValueError when the XML is malformed (after yielding the pages before the error)."""
    keep = {int(n) for n in namespaces}
    if hasattr(path, "read"):
        yield from _iter_pages(path, keep, getattr(path, "name", path))  # type: ignore[arg-type]
        return
    from longrag.store import open_source  # the storage layer reads local files and s3:// objects

    source = path if isinstance(path, str) else str(path)
    with open_source(source) as fh:
        yield from _iter_pages(fh, keep, source)


def _iter_pages(fh: IO[bytes], keep: set[int], name: Any) -> Iterator[RawPage]:
    try:
        root: ET.Element | None = None
        for event, el in ET.iterparse(fh, events=("start", "end")):
            if event == "start":
                if root is None:
                    root = el
                continue
            if _local(el.tag) != "page":
                continue
            raw = _page_from_element(el)
            el.clear()
            if root is not None:
                root.clear()  # drop finished pages so memory stays flat
            if raw.ns in keep:
                yield raw
    except ET.ParseError as e:
        raise ValueError(f"{name}: malformed MediaWiki XML: {e}") from e
