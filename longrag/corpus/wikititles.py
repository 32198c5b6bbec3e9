"""Wiki titles, article links and redirects: the MediaWiki canonical form of a title, whether a
wikilink points to an article (not a namespaced, interwiki or same-page link), and the following of
redirect chains over a corpus's links.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from urllib.parse import unquote

from longrag.types import Document

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
# File:/Image:/Category: links, and interlanguage links (a language code before the ':'), are
# not part of a page's prose.
INVISIBLE_LINK_NS: frozenset[str] = frozenset({"file", "image", "category"})
LANG_PREFIX = re.compile(r"^[a-z]{2,3}(?:-[a-z0-9]{2,8})*$")
_WS = re.compile(r"\s+")
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


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
    return bool(LANG_PREFIX.match(raw))


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
        out.append(Document(doc_id=d.doc_id, title=d.title, text=d.text, links=[t for t in dict.fromkeys(links) if t != own]))
    return out

