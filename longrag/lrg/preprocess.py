"""Data pre-processing of LRGinstruction ("LongRAG: A Dual-Perspective Retrieval-Augmented
Generation Paradigm for Long-Context Question Answering", Zhao et al., 2024, Section 3.2 and
Appendix C.1).

1. Drop a question-answer pair whose paragraphs together are shorter than a per-dataset token
   threshold (1.5k for HotpotQA and 2WikiMultiHopQA, 2.5k for MuSiQue), so the data keeps its
   long-context style.
2. Keep all supporting paragraphs P_s and sample distracting ones P_d: by default as many as there
   are supporting paragraphs, so P_s and P_d each make half of P (Section 3.2); ``random`` draws the
   count uniformly from [2, |P_d|] (Appendix C.1's random strategy).

Sampling is seeded per question (config seed + question id), so a rerun draws the same P.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Iterable

from longrag.eval.datasets import QAExample
from longrag.lrg.records import LRGConfig, Sample, SourceParagraph

TokenCounter = Callable[[str], int]


def question_rng(seed: int, key: str) -> random.Random:
    """A random generator seeded by ``seed`` and a question key (stable across runs and machines)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def sample_distractors(n_supporting: int, distractors: list, mode: str, rng: random.Random) -> list:
    """The distracting paragraphs to keep (a seeded subset of ``distractors``, in their order)."""
    n_all = len(distractors)
    if mode == "balanced":
        n = min(n_supporting, n_all)
    elif mode == "random":
        n = rng.randint(min(2, n_all), n_all) if n_all else 0
    else:
        raise ValueError(f"unknown distractor mode {mode!r}; valid: balanced, random")
    keep = sorted(rng.sample(range(n_all), n))
    return [distractors[i] for i in keep]


def preprocess_example(
    ex: QAExample, fmt: str, source: str, config: LRGConfig, count_tokens: TokenCounter
) -> tuple[Sample | None, str | None]:
    """One question -> its :class:`Sample`, or ``(None, reason)`` when it is dropped."""
    if not ex.paragraphs:
        return None, "no paragraphs"
    if not ex.answers or not ex.answers[0].strip():
        return None, "no answer"
    sup = [p for p in ex.paragraphs if p.is_supporting]
    dis = [p for p in ex.paragraphs if not p.is_supporting]
    if not sup:
        return None, "no supporting paragraph"
    total = sum(count_tokens(f"{p.title}\n{p.text}") for p in ex.paragraphs)
    if total < config.min_tokens_for(fmt):
        return None, "context too short"
    rng = question_rng(config.seed, f"{source}:{ex.qid}")
    chosen = sup + sample_distractors(len(sup), dis, config.distractors, rng)
    rng.shuffle(chosen)  # supporting paragraphs are not always first
    return (
        Sample(
            sample_id=f"{source}:{ex.qid}",
            source=source,
            format=fmt,
            qid=ex.qid,
            question=ex.question.strip(),
            answer=ex.answers[0].strip(),
            paragraphs=[SourceParagraph(title=p.title, text=p.text, supporting=p.is_supporting) for p in chosen],
            context_tokens=total,
        ),
        None,
    )


def preprocess(
    examples: Iterable[QAExample],
    fmt: str,
    source: str,
    config: LRGConfig,
    count_tokens: TokenCounter,
    limit: int | None = None,
) -> tuple[list[Sample], Counter]:
    """Pre-process one input file's questions; ``limit`` stops after that many kept samples.
    Returns the samples and the drop reasons with their counts."""
    samples: list[Sample] = []
    dropped: Counter = Counter()
    for ex in examples:
        if limit is not None and len(samples) >= limit:
            break
        s, reason = preprocess_example(ex, fmt, source, config, count_tokens)
        if s is None:
            dropped[reason] += 1
        else:
            samples.append(s)
    return samples, dropped
