"""Seeded synthetic long-context benchmarks (HashHop, BABILong-style, RULER-style) and
retrieval-only scoring. Every generator takes a target token length (tokens ~ characters / 4) and
a seed and returns a :class:`SyntheticSample` (document, question, answers, needle spans)."""

from lab.synthetic.babilong import generate_babilong, load_babi
from lab.synthetic.common import SyntheticSample, estimate_tokens, wikipedia_sentences
from lab.synthetic.hashhop import generate_hashhop
from lab.synthetic.ruler import RULER_TASKS, generate_ruler
from lab.synthetic.scoring import needle_recall, needles_found, top_word_overlap

__all__ = [
    "RULER_TASKS",
    "SyntheticSample",
    "estimate_tokens",
    "generate_babilong",
    "generate_hashhop",
    "generate_ruler",
    "load_babi",
    "needle_recall",
    "needles_found",
    "top_word_overlap",
    "wikipedia_sentences",
]
