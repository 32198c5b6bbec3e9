"""QA and retrieval metrics of the papers, and aggregation over questions.

- :func:`normalize_answer`: SQuAD normalization (lowercase, drop ASCII punctuation, drop the
  articles a/an/the, collapse whitespace). LongBench's English QA metric uses the same one.
- :func:`exact_match`, :func:`f1`: SQuAD/HotpotQA style, max over gold answers; with
  ``hotpot_special=True`` a yes/no/noanswer prediction or gold gets F1 0 unless both are equal.
- :func:`refined_exact_match`: LongRAG (Jiang et al., 2024, "LongRAG: Enhancing
  Retrieval-Augmented Generation with Long-context LLMs", Appendix 6.2 "Refined Metric"): EM, or a
  prediction of fewer than five tokens where the gold is contained in the prediction or the
  prediction in the gold.
- :func:`has_answer` / :func:`answer_recall_at_k`: DPR-style answer recall: an answer's token
  sequence occurs in the retrieved text (uncased, accent-folded, word-token boundaries).
- :func:`gold_recall_at_k`: all gold titles among the documents of the top-k retrieved units.
- :func:`longbench_qa_f1`: LongBench's English QA F1 (plain token F1, no yes/no special case).
- :func:`aggregate`, :func:`mean`, :func:`mean_curve`: averages over per-question scores.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

_PUNCT = set(string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_HOTPOT_SPECIAL = frozenset({"yes", "no", "noanswer"})


# --------------------------------------------------------------------------------------------- answers


def normalize_answer(s: str) -> str:
    """SQuAD normalization: lowercase, remove punctuation, remove articles, fix whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def _as_list(golds: str | Sequence[str]) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    golds = list(golds)
    if not golds:
        raise ValueError("gold answers are empty")
    return golds


def exact_match(prediction: str, golds: str | Sequence[str]) -> float:
    """1.0 when the normalized prediction equals a normalized gold answer."""
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in _as_list(golds)))


def f1_prf(prediction: str, gold: str, hotpot_special: bool = True) -> tuple[float, float, float]:
    """Token-level ``(f1, precision, recall)`` of one prediction against one gold answer."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if hotpot_special and (p in _HOTPOT_SPECIAL or g in _HOTPOT_SPECIAL) and p != g:
        return 0.0, 0.0, 0.0
    pt, gt = p.split(), g.split()
    if not pt or not gt:
        # both empty: a match; one empty: nothing in common
        v = float(pt == gt)
        return v, v, v
    common = Counter(pt) & Counter(gt)
    same = sum(common.values())
    if same == 0:
        return 0.0, 0.0, 0.0
    prec = same / len(pt)
    rec = same / len(gt)
    return 2 * prec * rec / (prec + rec), prec, rec


def f1(prediction: str, golds: str | Sequence[str], hotpot_special: bool = True) -> float:
    """Token F1, max over gold answers (HotpotQA's yes/no/noanswer rule when ``hotpot_special``)."""
    return max(f1_prf(prediction, g, hotpot_special)[0] for g in _as_list(golds))


def _contains_tokens(haystack: list[str], needle: list[str]) -> bool:
    if not needle or len(needle) > len(haystack):
        return False
    return f" {' '.join(needle)} " in f" {' '.join(haystack)} "


def refined_exact_match(
    prediction: str,
    golds: str | Sequence[str],
    max_tokens: int = 5,
    token_boundary: bool = True,
) -> float:
    """LongRAG's refined EM (Jiang et al., 2024, Appendix 6.2).

    1.0 when the standard EM holds, or when the normalized prediction has fewer than
    ``max_tokens`` tokens and a normalized gold is contained in it or it is contained in a gold.
    ``token_boundary=True`` (default) requires containment on whole tokens ("1" is not in
    "1988"); ``False`` is the literal character-substring reading. An empty prediction never matches.
    """
    if exact_match(prediction, golds):
        return 1.0
    p = normalize_answer(prediction)
    ptoks = p.split()
    if not ptoks or len(ptoks) >= max_tokens:
        return 0.0
    for g in _as_list(golds):
        gn = normalize_answer(g)
        if not gn:
            continue
        if token_boundary:
            gtoks = gn.split()
            if _contains_tokens(ptoks, gtoks) or _contains_tokens(gtoks, ptoks):
                return 1.0
        elif gn in p or p in gn:
            return 1.0
    return 0.0


def longbench_qa_f1(prediction: str, golds: str | Sequence[str]) -> float:
    """LongBench English QA F1: normalized token F1, max over answers, no yes/no special case."""
    return f1(prediction, golds, hotpot_special=False)


# --------------------------------------------------------------------------------------------- retrieval

_DPR_TOKEN_RE = re.compile(r"[^\W_]+|[^\w\s]|_", re.UNICODE)


def dpr_tokens(text: str) -> list[str]:
    """DPR-style uncased tokens: letter/digit runs and single non-space symbols, accents folded."""
    text = unicodedata.normalize("NFD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return [t.lower() for t in _DPR_TOKEN_RE.findall(text)]


def has_answer(text: str, answers: str | Sequence[str]) -> bool:
    """DPR answer match: some answer's token sequence occurs contiguously in the text's tokens."""
    hay = f" {' '.join(dpr_tokens(text))} "
    for a in _as_list(answers):
        toks = dpr_tokens(a)
        if toks and f" {' '.join(toks)} " in hay:
            return True
    return False


def _check_ks(ks: Iterable[int]) -> list[int]:
    ks = sorted(set(int(k) for k in ks))
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    return ks


def answer_recall_at_k(
    retrieved_texts: Sequence[str], answers: str | Sequence[str], ks: Iterable[int]
) -> dict[int, float]:
    """For each k: 1.0 when an answer occurs in any of the first k retrieved texts (ranked)."""
    ks = _check_ks(ks)
    first = None
    for i, t in enumerate(retrieved_texts[: ks[-1]]):
        if has_answer(t, answers):
            first = i
            break
    return {k: float(first is not None and first < k) for k in ks}


def gold_recall_at_k(
    retrieved_titles: Sequence[Sequence[str]], gold_titles: Sequence[str], ks: Iterable[int]
) -> dict[int, float]:
    """For each k: 1.0 when every gold title is among the titles of the first k retrieved units.

    ``retrieved_titles[i]`` holds the document titles of the i-th ranked unit (one title for a
    document unit, several for a grouped unit). HotpotQA: the two gold documents; MuSiQue: the
    titles of all supporting paragraphs.
    """
    ks = _check_ks(ks)
    gold = set(gold_titles)
    if not gold:
        raise ValueError("gold_titles is empty: gold recall is undefined for this question")
    seen: set[str] = set()
    covered_at: int | None = None
    for i, titles in enumerate(retrieved_titles[: ks[-1]]):
        if isinstance(titles, str):
            raise ValueError("retrieved_titles must be a list of title lists, one per unit")
        seen.update(titles)
        if gold <= seen:
            covered_at = i
            break
    return {k: float(covered_at is not None and covered_at < k) for k in ks}


def _squash(text: str) -> str:
    return " ".join(text.split())


def paragraphs_found(text: str, paragraphs: Sequence[str]) -> list[bool]:
    """For each gold paragraph: is all of it (whitespace aside) inside ``text``?"""
    hay = _squash(text)
    return [_squash(p) in hay for p in paragraphs]


def paragraph_recall_at_k(
    retrieved_texts: Sequence[str], paragraphs: Sequence[str], ks: Iterable[int]
) -> dict[int, float]:
    """For each k: the share of the question's gold (supporting) paragraphs lying whole inside one
    of the first k retrieved texts, HippoRAG's passage recall@k on long units. A paragraph cut
    across two passage units counts when both are retrieved and meet end to start in the text
    (the top-k texts are also searched joined in rank order)."""
    ks = _check_ks(ks)
    if not paragraphs:
        raise ValueError("no gold paragraphs: paragraph recall is undefined for this question")
    out: dict[int, float] = {}
    for k in ks:
        top = list(retrieved_texts[:k])
        found = [any(f) for f in zip(*(paragraphs_found(t, paragraphs) for t in [*top, " ".join(top)]))]
        out[k] = sum(found) / len(paragraphs)
    return out


def paragraph_recall_within(
    retrieved_texts: Sequence[str], n_tokens: Sequence[int], paragraphs: Sequence[str], budgets: Iterable[int],
    truncate: Callable[[str, int], str],
) -> dict[int, float]:
    """For each token budget B: the share of gold paragraphs lying whole inside the first B tokens
    of the retrieved texts read in rank order (``n_tokens[i]`` the i-th text's tokens,
    ``truncate(text, n)`` its first n tokens): recall at equal context, whatever the unit size."""
    budgets = _check_ks(budgets)
    if not paragraphs:
        raise ValueError("no gold paragraphs: paragraph recall is undefined for this question")
    out: dict[int, float] = {}
    for b in budgets:
        parts, room = [], b
        for text, n in zip(retrieved_texts, n_tokens):
            if room <= 0:
                break
            parts.append(text if n <= room else truncate(text, room))
            room -= n
        out[b] = sum(paragraphs_found("\n\n".join(parts), paragraphs)) / len(paragraphs)
    return out


def context_tokens_at_k(
    retrieved_texts: Sequence[str], counter: Callable[[str], int], ks: Iterable[int]
) -> dict[int, int]:
    """Tokens (by ``counter``) of the first k retrieved texts together, for each k."""
    ks = _check_ks(ks)
    return cumulative_at_k([int(counter(t)) for t in retrieved_texts[: ks[-1]]], ks)


def cumulative_at_k(counts: Sequence[int], ks: Iterable[int]) -> dict[int, int]:
    """Sum of the first k counts, for each k (k past the end sums everything)."""
    ks = _check_ks(ks)
    csum = [0]
    for c in counts:
        csum.append(csum[-1] + int(c))
    return {k: csum[min(k, len(counts))] for k in ks}


# --------------------------------------------------------------------------------------------- aggregation


def mean(values: Iterable[float | None]) -> float | None:
    """Mean of the non-None values; None when there are none."""
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _stats(vals: list[float]) -> dict[str, float | int | None]:
    n = len(vals)
    if n == 0:
        return {"mean": None, "n": 0, "stderr": None}
    m = sum(vals) / n
    if n > 1:
        var = sum((v - m) ** 2 for v in vals) / (n - 1)
        se = math.sqrt(var / n)
    else:
        se = 0.0
    return {"mean": m, "n": n, "stderr": se}


def aggregate(
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str] | None = None,
    group_by: str | None = None,
) -> dict[str, Any]:
    """Mean, count and standard error of numeric per-question fields.

    ``keys`` defaults to every field holding a number (bools count as 0/1) in some row; a row
    without the field, or with None, is left out of that field's average. With ``group_by``, the
    result has an ``"all"`` entry and one entry per value of that field (e.g. question type).
    """
    def numeric(v: Any) -> bool:
        return isinstance(v, (int, float, bool)) and not (isinstance(v, float) and math.isnan(v))

    if keys is None:
        found: dict[str, None] = {}
        for r in rows:
            for k, v in r.items():
                if numeric(v) and k != group_by:
                    found.setdefault(k, None)
        keys = list(found)

    def summarize(rs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {k: _stats([float(r[k]) for r in rs if k in r and numeric(r[k])]) for k in keys}

    if group_by is None:
        return summarize(rows)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(str(r.get(group_by)), []).append(r)
    return {"all": summarize(rows), **{g: summarize(rs) for g, rs in sorted(groups.items())}}


def mean_curve(per_question: Sequence[Mapping[int, float] | None]) -> dict[int, float]:
    """Average ``{k: score}`` dicts over questions (None entries skipped); keys as ints, sorted.

    Every question must have the same ks (a recall curve over a ragged set is misleading)."""
    rows = [dict((int(k), float(v)) for k, v in d.items()) for d in per_question if d is not None]
    if not rows:
        return {}
    ks = sorted(rows[0])
    for r in rows:
        if sorted(r) != ks:
            raise ValueError(f"per-question curves have different ks: {ks} vs {sorted(r)}")
    return {k: sum(r[k] for r in rows) / len(rows) for k in ks}
