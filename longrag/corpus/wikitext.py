"""Read MediaWiki XML exports into :class:`Document` records: the per-page parse and the whole-export
reader, over the streaming of :mod:`longrag.corpus.wikixml`, the markup stripping of
:mod:`longrag.corpus.wikimarkup` and the titles and redirects of :mod:`longrag.corpus.wikititles`.

:func:`parse_page` is a pure function ``RawPage -> Document`` that Ray Data maps over the streamed
pages; :func:`read_wikixml` streams, parses and redirect-resolves a whole export in one process and
returns a :class:`ReadReport`.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

from longrag.corpus.report import ReadReport
from longrag.corpus.wikimarkup import TEXT_MODES, LinkScope, TextMode, wikitext_to_text
from longrag.corpus.wikititles import DEFAULT_NAMESPACES, normalize_title, resolve_redirects
from longrag.corpus.wikixml import RawPage, iter_pages
from longrag.types import Document

log = logging.getLogger(__name__)


def parse_page(
    raw: RawPage,
    text_mode: TextMode = "full",
    link_scope: LinkScope = "all",
    namespaces: frozenset[str] = DEFAULT_NAMESPACES,
) -> Document:
    """Pure ``RawPage -> Document``: doc_id is the page id, links are normalized titles (not yet
    resolved through redirects, self links dropped). Raises ValueError for redirects, pages without
    an id, and pages without prose in the chosen ``text_mode``."""
    if raw.redirect is not None:
        raise ValueError(f"page {raw.page_id} {raw.title!r} is a redirect to {raw.redirect!r}")
    if not raw.page_id:
        raise ValueError(f"page {raw.title!r} has no page id")
    text, links = wikitext_to_text(raw.wikitext, text_mode, link_scope, namespaces)
    if not text:
        raise ValueError(f"page {raw.page_id} {raw.title!r}: no text left after markup removal ({text_mode})")
    title = normalize_title(raw.title)
    return Document(doc_id=raw.page_id, title=title, text=text, links=[t for t in links if t != title])


def try_parse_page(
    raw: RawPage,
    text_mode: TextMode = "full",
    link_scope: LinkScope = "all",
    namespaces: frozenset[str] = DEFAULT_NAMESPACES,
) -> tuple[Document | None, str | None]:
    """:func:`parse_page` that returns ``(None, reason)`` instead of raising, for batch jobs that
    count bad pages rather than fail."""
    try:
        return parse_page(raw, text_mode, link_scope, namespaces), None
    except ValueError as e:
        return None, str(e)
    except Exception as e:  # a parser bug on one page must not end a corpus build
        return None, f"page {raw.page_id} {raw.title!r}: parser error {type(e).__name__}: {e}"


def read_wikixml(
    path: str | Path,
    text_mode: TextMode = "full",
    link_scope: LinkScope = "all",
    namespaces: frozenset[str] = DEFAULT_NAMESPACES,
) -> tuple[list[Document], ReadReport]:
    """Stream, parse and redirect-resolve a whole export in this process.

    The report's ``stats`` hold: n_redirects, n_links (after resolution), n_links_in_corpus
    (links landing on another document of this export), parse_s and median_words."""
    if text_mode not in TEXT_MODES:
        raise ValueError(f"text_mode must be one of {TEXT_MODES}, got {text_mode!r}")
    report = ReadReport(source=path if isinstance(path, str) else str(path), fmt="wikixml")
    t0 = time.perf_counter()
    docs: list[Document] = []
    redirects: dict[str, str] = {}
    n_pages = 0
    try:
        for raw in iter_pages(path):
            n_pages += 1
            if raw.redirect is not None:
                if raw.redirect:
                    redirects[normalize_title(raw.title)] = raw.redirect
                else:
                    report.add_bad(None, f"redirect {raw.title!r} has an empty target", record=raw.page_id)
                continue
            doc, reason = try_parse_page(raw, text_mode, link_scope, namespaces)
            if doc is None:
                report.add_bad(None, reason or "unknown", record=raw.page_id or raw.title)
            else:
                docs.append(doc)
    except ValueError as e:  # truncated/malformed XML: keep what was read, say so
        report.add_bad(None, str(e), record=None)
        log.warning("%s", e)
    docs = resolve_redirects(docs, redirects)
    titles = {d.title for d in docs}
    words = [len(d.text.split()) for d in docs]
    report.n_ok = len(docs)
    report.stats.update(
        n_pages=n_pages,
        n_redirects=len(redirects),
        n_links=sum(len(d.links) for d in docs),
        n_links_in_corpus=sum(1 for d in docs for t in d.links if t in titles),
        median_words=statistics.median(words) if words else 0,
        parse_s=round(time.perf_counter() - t0, 3),
        text_mode=text_mode,
        link_scope=link_scope,
    )
    return docs, report
