"""Title-mention links for corpora without hyperlinks (``units.links=titles``): document A links
to B when A's text mentions B's title. One matcher for the evaluation's in-memory corpora
(:func:`title_mention_links`) and the index job's parts (:func:`mention_positions`, run by
``actors/distlinks.py``).

Hand-written because the rules are the product's own (a trie of folded title tokens; no library
matches titles with these alias and capitalization rules).

Matching rules (tested in ``tests/longrag/test_eval_links.py``):

- Text and titles are tokenized into runs of letters/digits after NFC; each token is folded
  (accents stripped via NFKD, casefolded). Punctuation and whitespace only separate tokens, so
  matches always sit on word boundaries ("Lothair II's" mentions "Lothair II"; "Bertha"
  does not match inside "Berthas").
- Aliases of a title: the full title; and, for a title ending in a parenthetical
  disambiguation ("Coney Island Baby (film)"), the part before it, *only when unambiguous*:
  no other title folds to that base and no other title has the same base
  ("Lloyd (film)" + "Lloyd (singer)" -> neither gets "Lloyd"; "Paris (band)" + "Paris" -> the
  base stays with the plain "Paris").
- Trivial aliases are dropped: fewer than ``min_alias_chars`` letters/digits, or only stopwords.
- One-token aliases need a capitalized (not all-lowercase) token in the text when the title
  itself is capitalized ("Poison" the band is not mentioned by "rat poison"); multi-token
  titles match case-insensitively.
- All matches count, overlapping ones included ("Bertha, daughter of Lothair II" mentions both
  itself and "Lothair II"); self-mentions are not links; links are ordered by first mention.

Matching is a token trie walked from every token position: cost ~ text tokens x matched
prefix depth, independent of the number of titles.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from longrag.index.grouping import normalize_title
from longrag.types import Document

_TOKEN_RE = re.compile(r"[^\W_]+")
_PAREN_RE = re.compile(r"^(.*?)\s*\(([^()]*)\)\s*$")
_STOPWORDS = frozenset(
    "a an the of in on at to for and or by with from as is was be it its this that these those "
    "he she they we you i his her their our my your not no".split()
)
_END = "\x00"


def fold_token(token: str) -> str:
    """Accent-strip and casefold one token."""
    if token.isascii():
        return token.lower()
    decomposed = unicodedata.normalize("NFKD", token)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


def tokenize_for_match(text: str) -> list[tuple[str, str]]:
    """``(folded, original)`` word tokens of a text (letters/digits runs, after NFC)."""
    return [(fold_token(m.group()), m.group()) for m in _TOKEN_RE.finditer(unicodedata.normalize("NFC", text))]


def _key(text: str) -> tuple[str, ...]:
    return tuple(f for f, _ in tokenize_for_match(text))


def _is_capitalized(title: str) -> bool:
    return any(ch.isupper() for ch in title)


class TitleMatcher:
    """Finds which of a set of titles a text mentions (see module docstring for the rules)."""

    def __init__(
        self,
        titles: Iterable[str],
        *,
        strip_parenthetical: bool = True,
        min_alias_chars: int = 3,
        single_token_needs_capital: bool = True,
    ) -> None:
        self.single_token_needs_capital = single_token_needs_capital
        titles = list(dict.fromkeys(titles))
        full: dict[tuple[str, ...], list[str]] = {}
        for t in titles:
            full.setdefault(_key(t), []).append(t)
        base: dict[tuple[str, ...], list[str]] = {}
        if strip_parenthetical:
            for t in titles:
                m = _PAREN_RE.match(t)
                if m and m.group(1).strip():
                    base.setdefault(_key(m.group(1)), []).append(t)
        aliases: dict[tuple[str, ...], list[str]] = {}
        for k, ts in full.items():
            aliases[k] = list(ts)
        self.n_base_aliases = 0
        self.n_ambiguous_bases = 0
        for k, ts in base.items():
            if k in full or len(ts) > 1:
                self.n_ambiguous_bases += 1
                continue
            aliases[k] = list(ts)
            self.n_base_aliases += 1
        self.aliases: dict[tuple[str, ...], list[str]] = {}
        self._capital: dict[tuple[str, ...], bool] = {}
        for k, ts in aliases.items():
            if not k or sum(len(tok) for tok in k) < min_alias_chars or all(tok in _STOPWORDS for tok in k):
                continue
            self.aliases[k] = ts
            self._capital[k] = any(_is_capitalized(t) for t in ts)
        self._trie: dict[str, Any] = {}
        for k in self.aliases:
            node = self._trie
            for tok in k:
                node = node.setdefault(tok, {})
            node[_END] = k

    def find(self, text: str) -> list[str]:
        """Titles mentioned in ``text``, in order of first mention (each once)."""
        toks = tokenize_for_match(text)
        folded = [f for f, _ in toks]
        out: dict[str, None] = {}
        trie = self._trie
        n = len(folded)
        for i in range(n):
            node = trie.get(folded[i])
            j = i
            while node is not None:
                key = node.get(_END)
                if key is not None:
                    if not (
                        len(key) == 1
                        and self.single_token_needs_capital
                        and self._capital[key]
                        and toks[i][1].islower()
                    ):
                        for t in self.aliases[key]:
                            out.setdefault(t, None)
                j += 1
                if j >= n:
                    break
                node = node.get(folded[j])
        return list(out)


def title_mention_links(
    docs: list[Document],
    *,
    strip_parenthetical: bool = True,
    min_alias_chars: int = 3,
    single_token_needs_capital: bool = True,
    keep_existing: bool = False,
) -> list[Document]:
    """New documents whose ``links`` are the corpus titles their text mentions (self excluded)."""
    matcher = TitleMatcher(
        (d.title for d in docs),
        strip_parenthetical=strip_parenthetical,
        min_alias_chars=min_alias_chars,
        single_token_needs_capital=single_token_needs_capital,
    )
    out = []
    for d in docs:
        found = [t for t in matcher.find(d.text) if t != d.title]
        links = list(dict.fromkeys([*d.links, *found])) if keep_existing else found
        out.append(replace(d, links=links))
    return out


def title_positions(titles: Sequence[str]) -> dict[str, int]:
    """Title -> position of the first document that has it."""
    out: dict[str, int] = {}
    for i, t in enumerate(titles):
        out.setdefault(t, i)
    return out


def mention_positions(matcher: Any, positions: dict[str, int], title: str, text: str) -> list[int]:
    """Positions of the documents whose titles ``text`` mentions (in order of first mention), the
    document's own title left out (as :func:`title_mention_links`)."""
    own = normalize_title(title)
    return [positions[t] for t in matcher.find(text) if normalize_title(t) != own and t in positions]
