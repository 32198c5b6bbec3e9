"""Link builders for corpora without hyperlinks (QA context pools, plain passage files).

Both builders return new :class:`~longrag.types.Document` objects with ``links`` filled with target
*titles*, so they feed the same grouping step as wikitext hyperlinks (``longrag.index.grouping``).

(a) :func:`title_mention_links`: document A links to B when A's text mentions B's title.

    Matching rules (chosen here, tested in ``tests/longrag/test_eval_links.py``):

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

(b) :func:`tfidf_neighbour_links`: scikit-learn TF-IDF vectors (title + text), cosine similarity,
    each document links to its top ``top_m`` neighbours with similarity >= ``threshold``.
    Similarities are computed in row blocks so memory stays O(block x n).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import replace
from typing import Any, Iterable

import numpy as np

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


def tfidf_neighbour_links(
    docs: list[Document],
    *,
    top_m: int = 5,
    threshold: float = 0.2,
    include_title: bool = True,
    block_size: int = 1024,
    keep_existing: bool = False,
    vectorizer_kwargs: dict[str, Any] | None = None,
) -> list[Document]:
    """New documents linking to their ``top_m`` most TF-IDF-cosine-similar others (sim >= threshold).

    Among equal similarities the lower document index comes first (which of several tied
    candidates makes the top-m cut is up to ``np.argpartition``). Documents sharing a title with the
    source are not linked (they are the same page).
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    if top_m < 1:
        raise ValueError(f"top_m must be >= 1, got {top_m}")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not docs:
        return []
    kwargs = {"stop_words": "english", "sublinear_tf": True, "dtype": np.float32}
    kwargs.update(vectorizer_kwargs or {})
    texts = [f"{d.title}\n{d.text}" if include_title else d.text for d in docs]
    try:
        X = TfidfVectorizer(**kwargs).fit_transform(texts).tocsr()  # rows L2-normalized
    except ValueError:  # empty vocabulary (all stopwords / empty texts)
        return [replace(d, links=list(d.links) if keep_existing else []) for d in docs]
    neighbours = tfidf_topm(X, top_m=top_m, threshold=threshold, block_size=block_size)
    out = []
    for i, d in enumerate(docs):
        found = [docs[j].title for j in neighbours[i] if docs[j].title != d.title]
        found = list(dict.fromkeys(found))
        links = list(dict.fromkeys([*d.links, *found])) if keep_existing else found
        out.append(replace(d, links=links))
    return out


def tfidf_topm(X: Any, *, top_m: int, threshold: float, block_size: int = 1024) -> list[list[int]]:
    """Top-``top_m`` neighbours (excluding self) of each row of an L2-normalized sparse matrix by
    cosine similarity, keeping similarity >= ``threshold``; best first, ties by index."""
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D, got shape {X.shape}")
    n = X.shape[0]
    XT = X.T.tocsc()
    result: list[list[int]] = []
    for start in range(0, n, block_size):
        stop = min(n, start + block_size)
        sims = np.asarray((X[start:stop] @ XT).todense(), dtype=np.float64)
        rows = np.arange(stop - start)
        sims[rows, rows + start] = -np.inf
        m = min(top_m, n - 1)
        if m <= 0:
            result.extend([] for _ in rows)
            continue
        if m < n - 1:
            cand = np.argpartition(-sims, m - 1, axis=1)[:, :m]
        else:
            cand = np.broadcast_to(np.arange(n), (len(rows), n))
        for r in rows:
            idx = cand[r]
            idx = idx[np.lexsort((idx, -sims[r, idx]))][:m]  # best first, ties by index
            keep = sims[r, idx] >= threshold - 1e-9
            result.append([int(j) for j in idx[keep]])
    return result


def link_stats(docs: list[Document]) -> dict[str, Any]:
    """Counts over the in-corpus link graph: directed and undirected edges, isolated documents
    (no in- or out-link), documents with out-links, dangling links (to titles not in the corpus)."""
    titles = {d.title for d in docs}
    directed: set[tuple[str, str]] = set()
    dangling = 0
    for d in docs:
        for t in d.links:
            if t in titles and t != d.title:
                directed.add((d.title, t))
            elif t not in titles:
                dangling += 1
    undirected = {tuple(sorted(e)) for e in directed}
    touched = {a for a, _ in directed} | {b for _, b in directed}
    isolated = sum(1 for d in docs if d.title not in touched)
    with_out = sum(1 for d in docs if any(t in titles and t != d.title for t in d.links))
    return {
        "documents": len(docs),
        "directed_edges": len(directed),
        "undirected_edges": len(undirected),
        "isolated_docs": isolated,
        "docs_with_outlinks": with_out,
        "dangling_links": dangling,
        "mean_out_degree": (len(directed) / len(docs)) if docs else 0.0,
    }


def build_links(
    docs: list[Document],
    method: str = "title_mentions",
    **kwargs: Any,
) -> list[Document]:
    """Dispatch: ``title_mentions``, ``tfidf``, or ``both`` (union, title-mention links first).

    ``kwargs`` go to the chosen builder; for ``both`` pass ``title_kwargs`` / ``tfidf_kwargs``.
    """
    if method == "title_mentions":
        return title_mention_links(docs, **kwargs)
    if method == "tfidf":
        return tfidf_neighbour_links(docs, **kwargs)
    if method == "both":
        a = title_mention_links(docs, **kwargs.get("title_kwargs", {}))
        b = tfidf_neighbour_links(docs, **kwargs.get("tfidf_kwargs", {}))
        return [replace(x, links=list(dict.fromkeys([*x.links, *y.links]))) for x, y in zip(a, b)]
    raise ValueError(f"unknown link method {method!r}; use title_mentions, tfidf or both")
