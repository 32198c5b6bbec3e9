"""The dual pipeline's reranker: its training data and how a ranking is scored (Ray-free).

Questions of the bundled HotpotQA (``supporting_facts`` titles) and MuSiQue (``is_supporting``)
samples give (question, paragraph, label) pairs, split by question into train / held-out
(:func:`split_by_question`, also the dual benchmark's held-out questions); hard negatives are a
question's own non-supporting paragraphs ordered by a scorer (:func:`tfidf_scorer`,
:func:`dense_scorer`); :func:`evaluate_ranking` is recall@k of the supporting paragraphs among a
question's paragraphs. Training itself is :mod:`longrag.training.reranker`.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from longrag.data import HOTPOTQA_SAMPLE, MUSIQUE_SAMPLE, data_path
from longrag.eval.datasets import QAExample, load_hotpotqa, load_musique

__all__ = [
    "SOURCES",
    "RerankPair",
    "Triple",
    "load_sources",
    "split_by_question",
    "paragraph_text",
    "make_pairs",
    "sample_negatives",
    "hard_negative_order",
    "make_triples",
    "recall_at_k",
    "evaluate_ranking",
    "tfidf_scorer",
    "dense_scorer",
]

#: Bundled training sources: name -> (data file, loader).
SOURCES: dict[str, tuple[str, Callable[..., Any]]] = {
    "hotpotqa": (HOTPOTQA_SAMPLE, load_hotpotqa),
    "musique": (MUSIQUE_SAMPLE, load_musique),
}

@dataclass(frozen=True)
class RerankPair:
    qid: str
    question: str
    text: str
    label: float



# -------------------------------------------------------------------------------------------- pairs


def load_sources(sources: Sequence[str], limit_per_source: int | None = None
                 ) -> tuple[list[tuple[str, QAExample]], dict[str, Any]]:
    """The bundled questions of ``sources`` (each tagged with its source) and their provenance:
    file, records, questions, malformed records."""
    out: list[tuple[str, QAExample]] = []
    prov: dict[str, Any] = {}
    for name in sources:
        rel, loader = SOURCES[name]
        res = loader(data_path(rel), limit=limit_per_source)
        usable = [ex for ex in res.examples if ex.paragraphs and any(p.is_supporting for p in ex.paragraphs)]
        prov[name] = {
            "file": f"data/{rel}",
            "records": res.n_records,
            "questions": len(res.examples),
            "with_support_labels": len(usable),
            "malformed": res.n_malformed,
        }
        out.extend((name, ex) for ex in usable)
    return out, prov


def _bucket(qid: str, seed: int) -> float:
    h = hashlib.sha256(f"{seed}:{qid}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def split_by_question(
    examples: Sequence[tuple[str, QAExample]], heldout_fraction: float, seed: int = 0
) -> tuple[list[tuple[str, QAExample]], list[tuple[str, QAExample]]]:
    """Deterministic split by question id (a question's paragraphs never straddle the split)."""
    train, held = [], []
    for src, ex in examples:
        (held if _bucket(f"{src}:{ex.qid}", seed) < heldout_fraction else train).append((src, ex))
    if not held and len(train) > 1:
        held.append(train.pop())
    return train, held


def paragraph_text(title: str, text: str) -> str:
    return f"{title}\n{text}" if title else text


def make_pairs(examples: Sequence[tuple[str, QAExample]]) -> list[RerankPair]:
    """One pair per (question, context paragraph), label 1.0 for supporting paragraphs."""
    return [
        RerankPair(f"{src}:{ex.qid}", ex.question, paragraph_text(p.title, p.text), 1.0 if p.is_supporting else 0.0)
        for src, ex in examples
        for p in ex.paragraphs
    ]


def sample_negatives(
    pairs: Sequence[RerankPair],
    per_positive: int | None,
    seed: int = 0,
    hardness: Callable[[RerankPair], float] | None = None,
) -> list[RerankPair]:
    """Every positive pair and at most ``per_positive`` times as many negatives of the same question:
    the hardest by ``hardness`` (e.g. the dense score: hard negatives) or a seeded random choice;
    order kept. ``None`` keeps every pair."""
    if per_positive is None:
        return list(pairs)
    rng = random.Random(seed)
    by_q: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        by_q.setdefault(p.qid, []).append(i)
    keep: set[int] = set()
    for idx in by_q.values():
        pos = [i for i in idx if pairs[i].label > 0]
        neg = [i for i in idx if pairs[i].label <= 0]
        n = min(len(neg), per_positive * len(pos))
        keep.update(pos)
        if hardness is None:
            keep.update(rng.sample(neg, n))
        else:
            keep.update(sorted(neg, key=lambda i: (-hardness(pairs[i]), i))[:n])
    return [p for i, p in enumerate(pairs) if i in keep]


@dataclass(frozen=True)
class Triple:
    """(question, supporting paragraph, non-supporting paragraph of the same question)."""

    qid: str
    question: str
    positive: str
    negative: str


def hard_negative_order(
    examples: Sequence[tuple[str, QAExample]], score: Callable[[str, list[str]], Sequence[float]] | None
) -> dict[str, list[str]]:
    """Per question (``src:qid``): its non-supporting paragraph texts, best-scored first by ``score``
    (the dense encoder: hard negatives), or in file order when ``score`` is None."""
    out: dict[str, list[str]] = {}
    for src, ex in examples:
        neg = [paragraph_text(p.title, p.text) for p in ex.paragraphs if not p.is_supporting]
        if score is not None and neg:
            s = list(score(ex.question, neg))
            neg = [neg[i] for i in sorted(range(len(neg)), key=lambda i: (-s[i], i))]
        out[f"{src}:{ex.qid}"] = neg
    return out


def make_triples(
    examples: Sequence[tuple[str, QAExample]], negatives: dict[str, list[str]], rounds: int, seed: int = 0
) -> list[list[Triple]]:
    """``rounds`` lists of triples, each with ONE positive per question (so no batch holds two
    positives of a question, which would be each other's false in-batch negative): round r takes the
    question's r-th supporting paragraph and r-th hardest negative (cycling), questions shuffled."""
    rng = random.Random(seed)
    out: list[list[Triple]] = []
    for r in range(rounds):
        rnd = []
        for src, ex in examples:
            key = f"{src}:{ex.qid}"
            pos = [paragraph_text(p.title, p.text) for p in ex.paragraphs if p.is_supporting]
            neg = negatives.get(key) or []
            if not pos or not neg:
                continue
            rnd.append(Triple(key, ex.question, pos[r % len(pos)], neg[r % len(neg)]))
        rng.shuffle(rnd)
        out.append(rnd)
    return out


# -------------------------------------------------------------------------------------------- ranking quality


def recall_at_k(scores: Sequence[float], labels: Sequence[float], k: int) -> float:
    """Share of the positive labels among the ``k`` best scores (ties: earlier first)."""
    pos = sum(1 for y in labels if y > 0)
    if pos == 0:
        return float("nan")
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
    return sum(1 for i in order if labels[i] > 0) / pos


def evaluate_ranking(
    examples: Sequence[tuple[str, QAExample]], score: Callable[[str, list[str]], Sequence[float]], ks: Sequence[int]
) -> dict[str, float]:
    """Mean recall@k over questions of a ranking function ``score(question, paragraph texts)``."""
    per_k: dict[int, list[float]] = {k: [] for k in ks}
    for _, ex in examples:
        texts = [paragraph_text(p.title, p.text) for p in ex.paragraphs]
        labels = [1.0 if p.is_supporting else 0.0 for p in ex.paragraphs]
        s = list(score(ex.question, texts))
        for k in ks:
            per_k[k].append(recall_at_k(s, labels, k))
    return {f"recall@{k}": round(float(np.mean(v)), 4) if v else float("nan") for k, v in per_k.items()}


def tfidf_scorer() -> Callable[[str, list[str]], list[float]]:
    """Cosine of TF-IDF vectors fitted on the question's own paragraphs (scikit-learn): lexical hard
    negatives at no model cost, as DPR's BM25 negatives (Karpukhin et al., 2020, Section 3.2)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    def score(question: str, texts: list[str]) -> list[float]:
        vec = TfidfVectorizer(stop_words="english", sublinear_tf=True).fit(texts + [question])
        m = vec.transform(texts)
        q = vec.transform([question])
        return [float(x) for x in (m @ q.T).toarray().reshape(-1)]

    return score


def dense_scorer(encoder: Any) -> Callable[[str, list[str]], list[float]]:
    """Cosine of the question with each text under a dense encoder (``Embedder``)."""

    def score(question: str, texts: list[str]) -> list[float]:
        q = np.asarray(encoder.encode_queries([question]), dtype=np.float32).reshape(-1)
        return [float(x) for x in np.asarray(encoder.encode_passages(texts), dtype=np.float32) @ q]

    return score
