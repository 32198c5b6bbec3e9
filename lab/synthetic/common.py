"""What every synthetic long-context generator shares: the sample record, the token estimate, the
data folder, and the Wikipedia filler text.

Token counts are estimated as ``ceil(characters / 4)`` (``CHARS_PER_TOKEN``), the usual rate of
GPT-style BPE tokenizers on English text; generators size documents with it so a length means the
same thing in every task. PG19 books (BABILong's noise) and Paul Graham essays (RULER's) are not
bundled: the filler is real Wikipedia prose from the DPR passages, the HotpotQA and the MuSiQue
paragraphs bundled in the repository's ``data/`` folder (see ``data/README.md``; about 2 MB of text,
i.e. ~0.5M tokens of distinct sentences; longer documents reuse sentences in a fresh random order).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from longrag.data import DPR_PASSAGES, HOTPOTQA_CORPUS, MUSIQUE_CORPUS, data_dir, data_path, open_text, read_text
from longrag.text.sentences import split_sentences
from longrag.text.tokens import CHARS_PER_TOKEN
from longrag.text.tokens import chars_estimate as estimate_tokens

__all__ = [
    "CHARS_PER_TOKEN",
    "SyntheticSample",
    "data_dir",
    "bundled_file",
    "estimate_tokens",
    "wikipedia_sentences",
    "FillerStream",
    "place_items",
]

MIN_FILLER_WORDS = 10  # BABILong keeps noise sentences of 10+ tokens


@dataclass
class SyntheticSample:
    """One generated long-context example.

    ``needles`` are the character spans (start, end) in ``document`` of the supporting facts or
    inserted needles a retriever must find; ``answers`` are the expected answer strings."""

    task: str
    document: str
    question: str
    answers: list[str]
    needles: list[tuple[int, int]]
    target_tokens: int
    seed: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        """Estimated tokens of the document (``ceil(chars / 4)``)."""
        return estimate_tokens(self.document)

    def needle_texts(self) -> list[str]:
        """The texts at :attr:`needles` (what a retriever must bring back)."""
        return [self.document[a:b] for a, b in self.needles]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["needles"] = [list(x) for x in self.needles]
        return d


def bundled_file(rel: str, root: str | None = None) -> Path:
    """``rel`` under the data folder ``root``, or under :func:`longrag.data.data_dir` (checked to
    exist, with an error naming the folder) when ``root`` is not given."""
    return Path(root) / rel if root else data_path(rel)


@lru_cache(maxsize=2)
def wikipedia_sentences(root: str | None = None, min_words: int = MIN_FILLER_WORDS) -> tuple[str, ...]:
    """Distinct Wikipedia sentences of at least ``min_words`` words, in a fixed order: DPR passages,
    HotpotQA paragraphs, MuSiQue paragraphs (the bundled samples under ``root``, default
    :func:`longrag.data.data_dir`)."""
    paragraphs: list[str] = []
    with open_text(bundled_file(DPR_PASSAGES, root)) as f:
        for line in f:
            contents = json.loads(line)["contents"]
            _, _, body = contents.partition("\n")  # drop the '"Title"' line
            paragraphs.append(body)
    hotpot = json.loads(read_text(bundled_file(HOTPOTQA_CORPUS, root)))
    for title in sorted(hotpot):
        paragraphs.append(" ".join(s.strip() for s in hotpot[title]))
    for row in json.loads(read_text(bundled_file(MUSIQUE_CORPUS, root))):
        paragraphs.append(row["text"])
    seen: set[str] = set()
    out: list[str] = []
    for para in paragraphs:
        for s in split_sentences(para.replace("\n", " ")):
            s = " ".join(s.split())
            if len(s.split()) >= min_words and s not in seen:
                seen.add(s)
                out.append(s)
    if not out:
        raise ValueError(f"no filler sentences found under {root or data_dir()}")
    return tuple(out)


class FillerStream:
    """An endless seeded stream of filler sentences: a random permutation of the pool, started at a
    random offset, reshuffled each time it wraps around."""

    def __init__(self, sentences: tuple[str, ...] | list[str], rng: random.Random):
        if not sentences:
            raise ValueError("filler pool is empty")
        self._pool = list(sentences)
        self._rng = rng

    def __iter__(self) -> Iterator[str]:
        order = list(range(len(self._pool)))
        self._rng.shuffle(order)
        i = self._rng.randrange(len(order))
        while True:
            if i >= len(order):
                self._rng.shuffle(order)
                i = 0
            yield self._pool[order[i]]
            i += 1

    def take_chars(self, n_chars: int, sep: str = " ") -> list[str]:
        """Sentences whose joined length (with ``sep``) reaches ``n_chars``; the last one is cut at a
        word boundary to fit (as BABILong truncates its last noise sentence)."""
        out: list[str] = []
        total = 0
        if n_chars <= 0:
            return out
        for s in self:
            extra = len(s) + (len(sep) if out else 0)
            if total + extra <= n_chars:
                out.append(s)
                total += extra
                continue
            room = n_chars - total - (len(sep) if out else 0)
            cut = s[:room].rsplit(" ", 1)[0] if room > 0 else ""
            if cut:
                out.append(cut)
            break
        return out


def place_items(n_slots: int, n_items: int, rng: random.Random, depths: list[float] | None = None) -> list[int]:
    """Insertion points (0..n_slots, sorted) for ``n_items`` items among ``n_slots`` filler pieces:
    uniform at random, or at the given fractional ``depths`` (0 = start, 1 = end)."""
    if depths is not None:
        if len(depths) != n_items:
            raise ValueError(f"got {len(depths)} depths for {n_items} items")
        return sorted(min(n_slots, max(0, round(d * n_slots))) for d in depths)
    return sorted(rng.randint(0, n_slots) for _ in range(n_items))


def assemble(pieces: list[tuple[str, bool]], sep: str = " ") -> tuple[str, list[tuple[int, int]]]:
    """Join ``(text, is_needle)`` pieces with ``sep``; return the text and the needle spans."""
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    for i, (text, is_needle) in enumerate(pieces):
        if i:
            parts.append(sep)
            pos += len(sep)
        if is_needle:
            spans.append((pos, pos + len(text)))
        parts.append(text)
        pos += len(text)
    return "".join(parts), spans
