"""Wikitext to plain text: parses a page's wikitext with mwparserfromhell and keeps readable prose
(templates, tables, references, files, categories and comments dropped; section headings kept as
plain lines), collecting the outgoing article links; ``text_mode="lead"`` keeps only the lead
section (the HotpotQA "abstract" setting of the LongRAG paper).
"""

from __future__ import annotations

import html
import re
from typing import Any, Literal

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

from longrag.corpus.wikititles import DEFAULT_NAMESPACES, INVISIBLE_LINK_NS, LANG_PREFIX, link_target

TextMode = Literal["full", "lead"]
TEXT_MODES: tuple[str, ...] = ("full", "lead")
LinkScope = Literal["all", "text"]
LINK_SCOPES: tuple[str, ...] = ("all", "text")

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

_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_QUOTES = re.compile(r"'{2,}")
_PAREN_OPEN_SEP = re.compile(r"\([ \t]*(?:[,;:][ \t]*)+")
_PAREN_CLOSE_SEP = re.compile(r"(?:[ \t]*[,;:])+[ \t]*\)")
_EMPTY_PARENS = re.compile(r"[ \t]*\([\s,;:\u2013\u2014-]*\)")
_SPACE_BEFORE_PUNCT = re.compile(r"[ \t]+([,.;:!?])(?=\s|$)")
_SPACES = re.compile(r"[ \t\u00a0\u2009\u200b]+")
_MANY_NEWLINES = re.compile(r"\n{3,}")
_WS = re.compile(r"\s+")


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
            if not colon and (prefix.lower() in INVISIBLE_LINK_NS or LANG_PREFIX.match(prefix)):
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
    return _cleanup("".join(r.out)), list(dict.fromkeys(links))

