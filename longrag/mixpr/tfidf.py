"""Sparse TF-IDF chunk embeddings, L2-normalised rows, kept as scipy CSR float32.

Long documents repeat chunks (RULER's noise haystack repeats five sentences thousands of times;
HashHop and list-like text repeat lines). Identical chunks have identical embeddings, so the
embedding is computed once per DISTINCT chunk text: ``matrix`` has one row per distinct text and
``classes[i]`` names the row of chunk ``i``. The weights are exactly scikit-learn's
``TfidfVectorizer`` on the full chunk list (smooth idf ``ln((1+n)/(1+df)) + 1`` with ``n`` and ``df``
counted over all chunks, duplicates included, then L2 row normalisation); document frequencies are
weighted by multiplicity. Tests check equality with ``TfidfVectorizer``.

Counting (:func:`count_terms`) does what scikit-learn's ``CountVectorizer`` does (lower-case each
text, ``re.findall(token_pattern)``, drop stop words, sorted vocabulary) without its per-text
Python loop: the distinct texts are joined with a separator that holds a sentinel token, the joined
text is lower-cased and tokenized at once, tokens get integer codes by a hash factorization, the
sentinels tell which text each token belongs to, and numpy/scipy count. The separator
``"\\n<sentinel>\\n"`` cannot change the tokens of its neighbours for word-like patterns (a newline
is a non-word character, and lower-casing is per character except the final-sigma rule, which a
newline also ends); a pattern for which the sentinel count does not come out exact falls back to
one ``findall`` per text. With scikit-learn's default pattern (``\\b\\w\\w+\\b``: the runs of two or
more word characters) the ASCII texts skip the regex engine: on ASCII ``\\w`` is ``[A-Za-z0-9_]``,
so ``str.translate`` turns every other character into a space and ``str.split`` cuts the runs; the
runs of one character are then dropped. The other texts go through ``findall`` as above.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np
import scipy.sparse as sp

from longrag.mixpr.config import MixPRConfig

__all__ = ["TfidfEmbedding", "Vocabulary", "count_terms", "embed_tfidf", "distinct"]

_SENTINEL = "qzxjv"  # short: the joined text holds one per text, and all of it is scanned
# Patterns whose tokens are exactly the maximal runs of two or more word characters (scikit-learn's
# default, with and without the flag that str patterns have anyway).
_WORD_RUN_PATTERNS = frozenset({r"(?u)\b\w\w+\b", r"\b\w\w+\b"})
# ASCII characters that are not word characters (re's \w on ASCII: [A-Za-z0-9_]) -> space.
_ASCII_NON_WORD = str.maketrans({c: " " for c in map(chr, range(128)) if not re.fullmatch(r"\w", c)})


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, uniques)``: int64 codes into the distinct values (object array, first-seen order)."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas comes with ray[data]
        index: dict = {}
        codes = np.fromiter((index.setdefault(v, len(index)) for v in values), np.int64, len(values))
        return codes, _object_array(list(index))
    codes, uniques = pd.factorize(values, sort=False)
    return codes.astype(np.int64, copy=False), np.asarray(uniques, dtype=object)


def _object_array(items: list) -> np.ndarray:
    """1-D object array of ``items`` (``np.array`` would make a 2-D array of equal-length tuples)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def distinct(texts: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(unique_texts, classes, counts)``: unique texts in first-seen order, ``classes[i]`` the
    index of ``texts[i]`` among them (int64 (n,)), ``counts[c]`` how often text ``c`` occurs."""
    classes, uniques = _factorize(_object_array(list(texts)))
    counts = np.bincount(classes, minlength=len(uniques)).astype(np.int64)
    return uniques.tolist(), classes, counts


class Vocabulary:
    """The sorted term list of a fitted counter, with the subset of scikit-learn's
    ``CountVectorizer`` API that MixPR uses (``get_feature_names_out``, ``vocabulary_``,
    ``transform``)."""

    def __init__(self, terms: list[str], token_pattern: str, lowercase: bool, stop_words: frozenset[str]):
        self.terms = terms
        self.pattern = re.compile(token_pattern)
        self.lowercase = lowercase
        self.stop_words = stop_words
        self._index: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.terms)

    @property
    def vocabulary_(self) -> dict[str, int]:
        """term -> column (built on first use)."""
        if self._index is None:
            self._index = dict(zip(self.terms, range(len(self.terms))))
        return self._index

    def get_feature_names_out(self) -> np.ndarray:
        return np.asarray(self.terms, dtype=object)

    def analyze(self, text: str) -> list[str]:
        """The tokens of one text, as the vectorizer sees them (stop words kept)."""
        return self.pattern.findall(text.lower() if self.lowercase else text)

    def transform(self, texts: Sequence[str]) -> sp.csr_matrix:
        """Term counts, CSR float64 (len(texts), n_terms); unknown words and stop words ignored."""
        if isinstance(texts, str):
            raise ValueError("texts must be a sequence of str, got a single str")
        index = self.vocabulary_
        rows: list[int] = []
        cols: list[int] = []
        for i, t in enumerate(texts):
            ids = [index[w] for w in self.analyze(t) if w in index]
            rows.extend([i] * len(ids))
            cols.extend(ids)
        m = sp.csr_matrix(
            (np.ones(len(rows)), (np.asarray(rows, np.int64), np.asarray(cols, np.int64))),
            shape=(len(texts), len(self.terms)),
        )
        m.sum_duplicates()
        return m


def _stop_words(name: str | None) -> frozenset[str]:
    if name is None:
        return frozenset()
    if name == "english":
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

        return frozenset(ENGLISH_STOP_WORDS)
    raise ValueError(f"stop_words must be 'english' or None, got {name!r}")


def _ascii_word_runs(text: str) -> list[str]:
    """The maximal runs of word characters of an ASCII text, of any length: every ASCII non-word
    character becomes a space (``str.translate`` on ASCII runs at C speed) and ``str.split`` cuts."""
    return text.translate(_ASCII_NON_WORD).split()


def _tokens(texts: list[str], cfg: MixPRConfig, pattern: re.Pattern) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(tokens, rows, with_short)``: every token of ``texts`` in order (object array) and the text
    it comes from (int64). ``with_short``: runs of one character are among the tokens (the ASCII
    path of the word-run pattern), and are not terms."""
    n = len(texts)
    groups: list[tuple[np.ndarray, Callable[[str], list[str]]]] = [(np.arange(n), pattern.findall)]
    with_short = cfg.token_pattern in _WORD_RUN_PATTERNS
    if with_short:
        is_ascii = np.fromiter(map(str.isascii, texts), dtype=bool, count=n)
        groups = [(np.flatnonzero(is_ascii), _ascii_word_runs), (np.flatnonzero(~is_ascii), pattern.findall)]
    for attempt in range(8):
        sentinel = _SENTINEL if attempt == 0 else f"{_SENTINEL}{attempt}x"
        sep = f"\n{sentinel}\n"
        if pattern.findall(sep) != [sentinel]:
            break  # this pattern does not see the sentinel as one token: no fast path
        parts, rows = [], []
        for idx, tokenize in groups:
            if idx.size == 0:
                continue
            joined = sep.join(texts if idx.size == n else [texts[i] for i in idx])
            toks = _object_array(tokenize(joined.lower() if cfg.lowercase else joined))
            is_sep = toks == sentinel
            if np.count_nonzero(is_sep) != idx.size - 1:
                break  # the sentinel also occurs in a text: try another one
            parts.append(toks[~is_sep])
            rows.append(idx[np.cumsum(is_sep)[~is_sep]])
        else:
            return np.concatenate(parts or [np.zeros(0, object)]), _cat_int(rows), with_short
    # slow path, exact for any pattern: one findall per text
    lists = [pattern.findall(t.lower() if cfg.lowercase else t) for t in texts]
    rows_slow = np.repeat(np.arange(n, dtype=np.int64), [len(x) for x in lists])
    return _object_array(list(chain.from_iterable(lists))), rows_slow, False


def _cat_int(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, np.int64)


def count_terms(texts: Sequence[str], config: MixPRConfig | None = None) -> tuple[sp.csr_matrix, Vocabulary]:
    """``(counts, vocabulary)``: what ``CountVectorizer(lowercase, token_pattern, stop_words)
    .fit_transform(texts)`` gives, counts as CSR float64 (len(texts), n_terms) with sorted columns.
    Raises ValueError("empty vocabulary ...") when no text has a term, as scikit-learn does."""
    cfg = config or MixPRConfig()
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of str, got a single str")
    texts = list(texts)
    pattern = re.compile(cfg.token_pattern)
    if pattern.groups > 1:
        raise ValueError(f"token_pattern {cfg.token_pattern!r} has more than one capturing group")
    stop = _stop_words(cfg.stop_words)
    tokens, rows, with_short = _tokens(texts, cfg, pattern)
    codes, uniques = _factorize(tokens)
    del tokens
    n_codes = len(uniques)
    is_term = np.ones(n_codes, dtype=bool)
    if with_short:
        is_term &= np.fromiter(map(len, uniques), dtype=np.int64, count=n_codes) >= 2
    if stop:
        is_term &= np.fromiter((u not in stop for u in uniques), dtype=bool, count=n_codes)
    terms = uniques[is_term]
    if not terms.size:
        raise ValueError("empty vocabulary; perhaps the documents only contain stop words")
    # sorted vocabulary (scikit-learn's column order); numpy's code-point order equals Python's
    # string order for strings without NUL characters
    if "\x00" in "".join(terms):
        order = np.array(sorted(range(terms.size), key=terms.__getitem__), dtype=np.int64)
    else:
        order = np.argsort(terms.astype(str))  # the terms are distinct: no ties
    col_of_term = np.empty(terms.size, dtype=np.int64)
    col_of_term[order] = np.arange(terms.size)
    col_of_code = np.full(n_codes, -1, dtype=np.int64)
    col_of_code[is_term] = col_of_term
    col = col_of_code[codes]
    keep = col >= 0
    counts = sp.csr_matrix(
        (np.ones(int(keep.sum())), (rows[keep], col[keep])), shape=(len(texts), terms.size), dtype=np.float64
    )
    counts.sum_duplicates()
    vocab = Vocabulary(terms[order].tolist(), cfg.token_pattern, cfg.lowercase, stop)
    return counts, vocab


class TfidfEmbedding:
    """TF-IDF of a chunk list, stored per distinct chunk text.

    matrix: CSR float32 (n_distinct, n_terms), rows L2-normalised (zero row: no term).
    classes: int64 (n_chunks,), row of ``matrix`` for each chunk. counts: int64 (n_distinct,).
    """

    def __init__(
        self,
        matrix: sp.csr_matrix,
        classes: np.ndarray,
        counts: np.ndarray,
        counter: Vocabulary | None,
        idf: np.ndarray | None,
        sublinear_tf: bool = False,
    ):
        self.matrix = matrix
        self.classes = classes
        self.counts = counts
        self.counter = counter
        self.idf = idf
        self.sublinear_tf = sublinear_tf

    @property
    def n_chunks(self) -> int:
        return int(self.classes.shape[0])

    @property
    def n_terms(self) -> int:
        return int(self.matrix.shape[1])

    def transform(self, texts: Sequence[str]) -> sp.csr_matrix:
        """CSR float32 (len(texts), n_terms), L2-normalised rows; unknown words are ignored."""
        if isinstance(texts, str):
            raise ValueError("texts must be a sequence of str, got a single str")
        texts = list(texts)
        if self.counter is None:
            return sp.csr_matrix((len(texts), 0), dtype=np.float32)
        return _weight(self.counter.transform(texts), self.idf, self.sublinear_tf)


def _weight(counts: sp.spmatrix, idf: np.ndarray, sublinear: bool) -> sp.csr_matrix:
    m = sp.csr_matrix(counts, dtype=np.float64)
    if sublinear:
        np.log(m.data, out=m.data)
        m.data += 1.0
    m.data *= idf[m.indices]
    sq = np.asarray(m.multiply(m).sum(axis=1)).ravel()
    norms = np.sqrt(sq)
    norms[norms == 0] = 1.0
    m.data /= np.repeat(norms, np.diff(m.indptr))
    out = m.astype(np.float32)
    out.sort_indices()
    return out


def embed_tfidf(texts: Sequence[str], config: MixPRConfig | None = None) -> TfidfEmbedding:
    """TF-IDF embeddings of ``texts`` (the chunks), computed once per distinct text. Text without
    any term (empty, punctuation, only stop words) gets a zero row, never an error."""
    cfg = config or MixPRConfig()
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of str, got a single str")
    texts = list(texts)
    uniq, classes, counts = distinct(texts)
    n = len(texts)
    if n == 0:
        return TfidfEmbedding(sp.csr_matrix((0, 0), dtype=np.float32), classes, counts, None, None)
    try:
        tf, counter = count_terms(uniq, cfg)
    except ValueError as exc:  # "empty vocabulary": no chunk has a term
        if "empty vocabulary" not in str(exc):
            raise
        return TfidfEmbedding(sp.csr_matrix((len(uniq), 0), dtype=np.float32), classes, counts, None, None)
    # document frequency over ALL chunks: each distinct text counts as often as it occurs
    df = np.bincount(tf.indices, weights=np.repeat(counts, np.diff(tf.indptr)).astype(np.float64), minlength=tf.shape[1])
    idf = np.log((1.0 + n) / (1.0 + df)) + 1.0
    return TfidfEmbedding(_weight(tf, idf, cfg.sublinear_tf), classes, counts, counter, idf, cfg.sublinear_tf)
