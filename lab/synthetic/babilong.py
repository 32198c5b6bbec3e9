"""BABILong-style generator, written from the benchmark's description (Kuratov et al., 2024,
"BABILong: Testing the Limits of LLMs with Long Context Reasoning-in-a-Haystack"; used as a
retrieval test by Alonso and Millidge, 2024, "Mixture-of-PageRanks: Replacing Long-Context with
Real-Time, Sparse GraphRAG", Section 5 and Appendix A.2); no code copied.

A bAbI story (Weston et al., 2016, "Towards AI-Complete Question Answering: A Set of Prerequisite
Toy Tasks"; tasks qa1..qa5, the ones BABILong releases, bundled in ``data/babi/``) is hidden in
long filler text: every fact of the story before the question is inserted, in order, at uniformly
drawn sentence boundaries of the filler. The supporting facts named by bAbI are the ``needles``.
Filler: Wikipedia sentences (PG19, the original noise, is not bundled; see
``lab.synthetic.common``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from lab.synthetic.common import (
    CHARS_PER_TOKEN,
    FillerStream,
    SyntheticSample,
    assemble,
    bundled_file,
    place_items,
    wikipedia_sentences,
)
from longrag.data import BABI_DIR, read_text

__all__ = ["BabiQuestion", "TASK_FILES", "load_babi", "generate_babilong"]

TASK_FILES = {
    "qa1": "qa1_single-supporting-fact_train.txt.gz",
    "qa2": "qa2_two-supporting-facts_train.txt.gz",
    "qa3": "qa3_three-supporting-facts_train.txt.gz",
    "qa4": "qa4_two-arg-relations_train.txt.gz",
    "qa5": "qa5_three-arg-relations_train.txt.gz",
}


@dataclass(frozen=True)
class BabiQuestion:
    """One bAbI question with the facts of its story that come before it."""

    facts: tuple[str, ...]
    question: str
    answer: str
    supporting: tuple[int, ...]  # indices into ``facts``


def parse_babi(text: str) -> list[BabiQuestion]:
    """Parse bAbI lines (``id text`` / ``id question<TAB>answer<TAB>supporting ids``; ``|`` is
    accepted in place of the tabs); a story restarts when the id is 1."""
    out: list[BabiQuestion] = []
    facts: list[str] = []
    index_of: dict[int, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        raw = raw.rstrip("\n")
        if not raw.strip():
            continue
        num, _, rest = raw.partition(" ")
        try:
            lid = int(num)
        except ValueError:
            raise ValueError(f"bAbI line {lineno}: no leading id in {raw!r}") from None
        if lid == 1:
            facts, index_of = [], {}
        sep = "\t" if "\t" in rest else ("|" if "|" in rest and "?" in rest else None)
        if sep is not None:  # a question line (the shipped qa1 file uses '|' instead of tabs)
            parts = rest.split(sep)
            if len(parts) < 3:
                raise ValueError(f"bAbI line {lineno}: question line needs question, answer, ids: {raw!r}")
            q, ans, sup = parts[0].strip(), parts[1].strip(), parts[2].split()
            try:
                supporting = tuple(index_of[int(s)] for s in sup)
            except KeyError as exc:
                raise ValueError(f"bAbI line {lineno}: supporting id {exc} is not a fact of the story") from None
            out.append(BabiQuestion(tuple(facts), q, ans, supporting))
        else:
            index_of[lid] = len(facts)
            facts.append(rest.strip())
    return out


@lru_cache(maxsize=8)
def load_babi(task: str, root: str | None = None) -> tuple[BabiQuestion, ...]:
    """All questions of bAbI task ``task`` (``qa1``..``qa5``), 1k train split (the one bundled)."""
    if task not in TASK_FILES:
        raise ValueError(f"unknown bAbI task {task!r}; expected one of {sorted(TASK_FILES)}")
    path = bundled_file(f"{BABI_DIR}/{TASK_FILES[task]}", root)
    return tuple(parse_babi(read_text(path)))


def generate_babilong(task: str, target_tokens: int, seed: int = 0, *, question_index: int | None = None) -> SyntheticSample:
    """A BABILong-style sample of about ``target_tokens`` tokens for bAbI ``task``; the question is
    drawn with ``seed`` unless ``question_index`` picks it."""
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be >= 1, got {target_tokens}")
    questions = load_babi(task)
    rng = random.Random(f"babilong:{task}:{seed}:{target_tokens}")
    max_facts = max(1, target_tokens // 8)  # BABILong drops stories too long for short lengths
    if question_index is None:
        pool = [i for i, q in enumerate(questions) if len(q.facts) <= max_facts] or list(range(len(questions)))
        question_index = rng.choice(pool)
    if not 0 <= question_index < len(questions):
        raise ValueError(f"question_index must be in [0, {len(questions)}), got {question_index}")
    bq = questions[question_index]

    facts_chars = sum(len(f) + 1 for f in bq.facts)
    filler_chars = target_tokens * CHARS_PER_TOKEN - facts_chars
    noise = FillerStream(wikipedia_sentences(), rng).take_chars(filler_chars)
    slots = place_items(len(noise), len(bq.facts), rng)
    supporting = set(bq.supporting)
    pieces: list[tuple[str, bool]] = []
    k = 0
    for i in range(len(noise) + 1):
        while k < len(slots) and slots[k] == i:
            pieces.append((bq.facts[k], k in supporting))
            k += 1
        if i < len(noise):
            pieces.append((noise[i], False))
    doc, spans = assemble(pieces)
    # spans come in document order = fact order; map them back to bAbI's supporting order
    sup_sorted = sorted(supporting)
    span_of = dict(zip(sup_sorted, spans))
    needles = [span_of[i] for i in bq.supporting]
    return SyntheticSample(
        task=f"babilong_{task}",
        document=doc,
        question=bq.question,
        answers=[bq.answer],
        needles=needles,
        target_tokens=target_tokens,
        seed=seed,
        meta={"question_index": question_index, "n_facts": len(bq.facts), "supporting": list(bq.supporting)},
    )
