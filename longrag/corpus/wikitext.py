"""Read MediaWiki XML exports (``.xml``, ``.xml.bz2``, ``.xml.gz``) into :class:`Document` records.

The work is split so a cluster can spread the expensive part:

* :func:`iter_pages` streams the export (``xml.etree.ElementTree.iterparse`` with element
  clearing, so memory stays flat) and yields cheap :class:`RawPage` records: main-namespace
  articles and redirects, with their raw wikitext.
* :func:`parse_page` is a pure function ``RawPage -> Document``: it parses the wikitext with
  mwparserfromhell, keeps readable prose (templates, tables, references, files, categories and
  comments are dropped; section headings stay as plain lines) and collects the outgoing article
  links as normalized titles. ``text_mode="lead"`` keeps only the lead section and its links
  (the HotpotQA "abstract" setting of the LongRAG paper). Ray Data maps this over RawPage rows.
* :func:`resolve_redirects` rewrites links through the redirect map, once all pages are known.

:func:`read_wikixml` chains the three in one process and returns a :class:`ReadReport`.
"""

from __future__ import annotations

import html
import logging
import re
import statistics
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Literal
from urllib.parse import unquote

import mwparserfromhell
from mwparserfromhell.nodes import (
    Argument,
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)
from mwparserfromhell.wikicode import Wikicode

from longrag.corpus.report import ReadReport
from longrag.types import Document

log = logging.getLogger(__name__)

TextMode = Literal["full", "lead"]
TEXT_MODES: tuple[str, ...] = ("full", "lead")
LinkScope = Literal["all", "text"]
LINK_SCOPES: tuple[str, ...] = ("all", "text")

# Namespace names and aliases of English Wikipedia (lower case). A link whose prefix before the
# first ':' is one of these points to a non-article page and is not an article link.
DEFAULT_NAMESPACES: frozenset[str] = frozenset(
    {
        "media", "special", "talk", "user", "user talk", "wikipedia", "wikipedia talk", "project",
        "project talk", "wp", "wt", "file", "file talk", "image", "image talk", "mediawiki",
        "mediawiki talk", "template", "template talk", "help", "help talk", "category",
        "category talk", "portal", "portal talk", "book", "book talk", "draft", "draft talk",
        "education program", "education program talk", "timedtext", "timedtext talk", "module",
        "module talk", "gadget", "gadget talk", "gadget definition", "gadget definition talk",
        "topic", "mos", "cat", "h", "t", "tm", "u", "ut", "p", "wikiproject", "mos talk",
    }
)
# Interwiki prefixes of the Wikimedia projects (matched case-insensitively). Language prefixes
# (``fr:``, ``zh-yue:``, ``simple:``) are recognized by shape when written in lower case.
INTERWIKI_PREFIXES: frozenset[str] = frozenset(
    {
        "wikt", "wiktionary", "w", "wikipedia", "commons", "c", "s", "wikisource", "q", "wikiquote",
        "b", "wikibooks", "n", "wikinews", "v", "wikiversity", "voy", "wikivoyage", "species",
        "wikispecies", "d", "wikidata", "m", "meta", "metawikipedia", "mw", "mediawikiwiki",
        "foundation", "wmf", "phabricator", "phab", "outreach", "incubator", "mediazilla",
        "bugzilla", "simple", "google", "imdbname", "imdbtitle", "doi", "arxiv", "rfc", "iarchive",
        "oldwikisource", "sep11", "gutenberg", "wikia",
    }
)
_INVISIBLE_LINK_NS: frozenset[str] = frozenset({"file", "image", "category"})
_LANG_PREFIX = re.compile(r"^[a-z]{2,3}(?:-[a-z0-9]{2,8})*$")

# Tags whose content is not prose: dropped together with everything inside.
_DROP_TAGS: frozenset[str] = frozenset(
    {
        "ref", "references", "table", "gallery", "math", "chem", "ce", "timeline", "imagemap",
        "score", "graph", "syntaxhighlight", "source", "pre", "templatedata", "categorytree",
        "inputbox", "mapframe", "maplink", "hiero", "includeonly",
        "indicator", "section", "charinsert",
    }
)
_BLOCK_TAGS: frozenset[str] = frozenset(
    {"p", "div", "blockquote", "li", "dd", "dt", "ul", "ol", "dl", "center", "h1", "h2", "h3", "h4", "h5", "h6"}
)
# A few inline templates whose point is visible text: keep their last positional parameter.
_KEEP_LAST_PARAM_TEMPLATES: frozenset[str] = frozenset({"nowrap", "nobr", "lang", "small", "big", "smaller", "transl"})

_REDIRECT_TEXT = re.compile(r"^\s*#redirect\s*:?\s*\[\[([^\]|]+)", re.IGNORECASE)
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_QUOTES = re.compile(r"'{2,}")
_PAREN_OPEN_SEP = re.compile(r"\([ \t]*(?:[,;:][ \t]*)+")
_PAREN_CLOSE_SEP = re.compile(r"(?:[ \t]*[,;:])+[ \t]*\)")
_EMPTY_PARENS = re.compile(r"[ \t]*\([\s,;:\u2013\u2014-]*\)")
_SPACE_BEFORE_PUNCT = re.compile(r"[ \t]+([,.;:!?])(?=\s|$)")
_SPACES = re.compile(r"[ \t\u00a0\u2009\u200b]+")
_MANY_NEWLINES = re.compile(r"\n{3,}")
_WS = re.compile(r"\s+")
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


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
    def from_row(cls, row: dict[str, Any]) -> "RawPage":
        redirect = row.get("redirect")
        return cls(
            title=str(row["title"]),
            ns=int(row["ns"]),
            page_id=str(row["page_id"]),
            redirect=None if redirect is None else str(redirect),
            wikitext=str(row.get("wikitext") or ""),
        )


# ---------------------------------------------------------------------------------------------
# titles and links


def normalize_title(title: str) -> str:
    """MediaWiki-style canonical title: underscores to spaces, whitespace collapsed and stripped,
    first letter upper case (``"foo_bar  baz"`` -> ``"Foo bar baz"``)."""
    if not isinstance(title, str):
        raise ValueError(f"title must be a str, got {type(title).__name__}")
    t = _WS.sub(" ", title.replace("_", " ")).strip()
    if not t:
        return t
    first = t[0].upper()
    if len(first) != 1:  # e.g. 'ß' -> 'SS': MediaWiki keeps such letters as they are
        first = t[0]
    return first + t[1:]


def _is_namespaced(title: str, namespaces: frozenset[str]) -> bool:
    """True when ``title`` (leading ':' already removed) is a namespaced or interwiki link."""
    prefix, sep, _ = title.partition(":")
    if not sep:
        return False
    raw = prefix.strip()
    low = _WS.sub(" ", raw.replace("_", " ")).lower()
    if len(raw) == 1 and not raw.islower():
        return False  # one-letter prefixes (w:, s:, d:, t:) only as written in lower case: "V: The Final Battle"
    if low in namespaces or low in INTERWIKI_PREFIXES:
        return True
    # interlanguage links are written in lower case: [[fr:Paris]], [[zh-yue:...]]
    return bool(_LANG_PREFIX.match(raw))


def link_target(raw_title: str, namespaces: frozenset[str] = DEFAULT_NAMESPACES) -> str | None:
    """The normalized article title a wikilink points to, or None when it is not an article link
    (File:/Category:/other namespaces, interwiki, same-page anchors, titles holding markup)."""
    t = html.unescape(str(raw_title)).strip()
    if _PERCENT_ESCAPE.search(t):
        t = unquote(t)
    if any(c in t for c in "{}[]<>|"):
        return None
    t = t.lstrip().lstrip(":").strip()
    t = t.split("#", 1)[0]
    if not t.strip():
        return None
    if _is_namespaced(t, namespaces):
        return None
    t = normalize_title(t)
    return t or None


# ---------------------------------------------------------------------------------------------
# streaming the export


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


# ---------------------------------------------------------------------------------------------
# wikitext -> plain text + links


class _Render:
    """Walks a parsed page and collects prose and article links."""

    def __init__(self, namespaces: frozenset[str]) -> None:
        self.namespaces = namespaces
        self.out: list[str] = []
        self.links: list[str] = []

    def nodes(self, code: Wikicode) -> None:
        for node in code.nodes:
            if isinstance(node, Heading):
                title = _Render(self.namespaces)
                title.nodes(node.title)
                self.links.extend(title.links)
                self.out.append("\n\n" + _WS.sub(" ", "".join(title.out)).strip() + "\n")
            else:
                self.node(node)

    def node(self, node: Any) -> None:
        if isinstance(node, Text):
            self.out.append(node.value)
        elif isinstance(node, Wikilink):
            self.wikilink(node)
        elif isinstance(node, Tag):
            self.tag(node)
        elif isinstance(node, HTMLEntity):
            try:
                self.out.append(node.normalize())
            except (ValueError, OverflowError):
                pass
        elif isinstance(node, ExternalLink):
            if node.title is not None and node.brackets:
                self.nodes(node.title)
        elif isinstance(node, Template):
            self.template(node)
        elif isinstance(node, (Comment, Argument)):
            pass
        # anything else (unknown node types) carries no prose

    def wikilink(self, node: Wikilink) -> None:
        title = str(node.title)
        target = link_target(title, self.namespaces)
        if target is None:
            body = title.strip()
            colon = body.startswith(":")
            body = html.unescape(body.lstrip(":")).strip()
            prefix = body.partition(":")[0].strip() if ":" in body else ""
            if not colon and (prefix.lower() in _INVISIBLE_LINK_NS or _LANG_PREFIX.match(prefix)):
                return  # File:/Image:/Category: and interlanguage links are not part of the prose
            # same-page anchors, [[:Category:X|label]], [[wikt:x|label]], [[Help:...]]: visible
            if node.text is not None:
                self.nodes(node.text)
            else:
                self.out.append(body[1:] if body.startswith("#") else body)
            return
        self.links.append(target)
        if node.text is not None:
            self.nodes(node.text)
        else:
            self.out.append(html.unescape(title).strip().lstrip(":").strip())

    def tag(self, node: Tag) -> None:
        name = str(node.tag).strip().lower()
        if name in _DROP_TAGS:
            return
        if name in ("br", "hr"):
            self.out.append("\n")
            return
        # HTML block tags break lines; wiki list markup (*, #, ;, :) already sits on its own line
        block = name in _BLOCK_TAGS and not node.wiki_markup
        if block:
            self.out.append("\n")
        if node.contents is not None and not node.self_closing:
            self.nodes(node.contents)
        if block:
            self.out.append("\n")

    def template(self, node: Template) -> None:
        name = _WS.sub(" ", str(node.name).replace("_", " ")).strip().lower()
        positional = [p for p in node.params if not p.showkey]
        if name in _KEEP_LAST_PARAM_TEMPLATES and positional:
            self.nodes(positional[-1].value)
        elif name in ("convert", "cvt") and len(positional) >= 2:
            vals = [str(p.value).strip() for p in positional]
            parts = [vals[0]]
            i = 1
            while i + 1 < len(vals) and vals[i] in {"-", "–", "to", "and", "or", "by", "x", "×", "+/-", "±"}:
                parts += [vals[i].replace("-", "–"), vals[i + 1]]
                i += 2
            if i < len(vals):
                parts.append(vals[i])
            self.out.append(" ".join(parts))
        # all other templates (infoboxes, citations, navboxes, maintenance tags) are dropped


def _cleanup(text: str) -> str:
    text = _MAGIC_WORD.sub("", text)
    text = _QUOTES.sub(_quotes, text)
    text = _SPACES.sub(" ", text)
    text = _PAREN_OPEN_SEP.sub("(", text)
    text = _PAREN_CLOSE_SEP.sub(")", text)
    text = _EMPTY_PARENS.sub("", text)
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    lines = [ln.strip() for ln in text.split("\n")]
    text = "\n".join(lines)
    text = _MANY_NEWLINES.sub("\n\n", text)
    return text.strip()


def _dedupe(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def _parse(wikitext: str) -> Wikicode:
    # Bold/italic quotes are left as text: mwparserfromhell's handling of them can turn long
    # stretches (with refs and templates inside) into plain text; they are stripped in cleanup.
    return mwparserfromhell.parse(wikitext, skip_style_tags=True)


def _quotes(m: re.Match[str]) -> str:
    n = len(m.group(0))
    return "'" if n == 4 else "'" * (n - 5) if n > 5 else ""


_HEADING_LINE = re.compile(r"^(={1,6})[^=\n].*?\1[ \t]*$", re.MULTILINE)
_UNCLOSED = ("{{", "}}", "[[", "]]", "{|", "<")


def _lead_nodes(code: Wikicode) -> Wikicode:
    nodes = []
    for node in code.nodes:
        if isinstance(node, Heading):
            break
        nodes.append(node)
    return Wikicode(nodes)


def _parse_lead(wikitext: str) -> Wikicode:
    """The lead section (top-level nodes before the first heading) of a page. Fast path: parse
    only the text up to the first heading-like line, and accept it when that line is a top-level
    heading there and nothing before it was left unclosed; else parse the whole page."""
    m = _HEADING_LINE.search(wikitext)
    if m is None:
        return _lead_nodes(_parse(wikitext))
    prefix = _parse(wikitext[: m.end()])
    if prefix.nodes and isinstance(prefix.nodes[-1], Heading):
        lead = prefix.nodes[:-1]
        unclosed = any(isinstance(n, Text) and any(u in n.value for u in _UNCLOSED) for n in lead)
        if not unclosed and not any(isinstance(n, Heading) for n in lead):
            return Wikicode(lead)
    return _lead_nodes(_parse(wikitext))


def wikitext_to_text(
    wikitext: str,
    text_mode: TextMode = "full",
    link_scope: LinkScope = "all",
    namespaces: frozenset[str] = DEFAULT_NAMESPACES,
) -> tuple[str, list[str]]:
    """Plain text and outgoing article links (normalized, first-seen order, de-duplicated) of a
    wikitext string. ``link_scope="all"`` takes every article link of the page (or of the lead
    section), also those inside templates such as infoboxes, tables, references and captions;
    ``"text"`` only the links whose words stay in the plain text."""
    if text_mode not in TEXT_MODES:
        raise ValueError(f"text_mode must be one of {TEXT_MODES}, got {text_mode!r}")
    if link_scope not in LINK_SCOPES:
        raise ValueError(f"link_scope must be one of {LINK_SCOPES}, got {link_scope!r}")
    code = _parse_lead(wikitext) if text_mode == "lead" else _parse(wikitext)
    r = _Render(namespaces)
    r.nodes(code)
    if link_scope == "text":
        links = r.links
    else:
        links = [t for t in (link_target(str(w.title), namespaces) for w in code.filter_wikilinks()) if t]
    return _cleanup("".join(r.out)), _dedupe(links)


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


# ---------------------------------------------------------------------------------------------
# redirects


def resolve_title(title: str, redirects: dict[str, str]) -> str:
    """Follow ``redirects`` (normalized source -> target) from ``title``. A cycle has no article at
    its end, so then the normalized input title is returned unchanged."""
    start = normalize_title(title)
    cur = start
    seen = {cur}
    while cur in redirects:
        nxt = normalize_title(redirects[cur])
        if nxt in seen:
            return start  # redirect cycle: no article at the end of it
        seen.add(nxt)
        cur = nxt
    return cur


def resolve_redirects(docs: Iterable[Document], redirects: dict[str, str]) -> list[Document]:
    """New documents whose links go through ``redirects`` (chains followed, cycles guarded: a link
    into a cycle is left as written), de-duplicated in first-seen order, self links dropped."""
    red = {normalize_title(k): normalize_title(v) for k, v in redirects.items()}
    out = []
    for d in docs:
        own = normalize_title(d.title)
        links = [resolve_title(t, red) for t in d.links]
        out.append(Document(doc_id=d.doc_id, title=d.title, text=d.text, links=[t for t in _dedupe(links) if t != own]))
    return out


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
