"""HashHop-style multi-hop generator, written from the recipe of Magic's hash-hop benchmark
(github.com/magicproduct/hash-hop, MIT; used by Alonso and Millidge, 2024, "Mixture-of-PageRanks:
Replacing Long-Context with Real-Time, Sparse GraphRAG", Section 5 and Appendix A.2); no code copied.

The document is a shuffled list of assignments ``a = b`` between random 16-letter hashes,
forming chains ``h0 -> h1 -> ... -> hH``; the last link of each chain is written with quotes
(``h(H-1) = 'hH'``). The question names ``h0``; the answer is ``hH`` (or the whole chain with
chain of thought). The supporting facts (``needles``) are the H facts of the queried chain.

``fmt`` writes the same facts in other ordinary layouts, so a retriever can be checked against the
formatting it will meet (see :data:`HASHHOP_FORMATS`): one fact per line with or without a final
period, lines that start in lower case, bulleted and numbered lists, and prose paragraphs.
"""

from __future__ import annotations

import math
import random
import string

from lab.synthetic.common import CHARS_PER_TOKEN, SyntheticSample, assemble

__all__ = ["HASHHOP_FORMATS", "generate_hashhop", "random_hash"]

_LETTERS = string.ascii_letters

# fmt -> (what it looks like, characters a fact adds to its two hashes)
HASHHOP_FORMATS: dict[str, tuple[str, int]] = {
    "lines": ("one fact per line, no period: a = b (the recipe's layout)", 3),
    "periods": ("one fact per line ending in a period: a = b.", 4),
    "lowercase": ("one fact per line ending in a period, every hash (so every line) in lower case", 4),
    "bullets": ("a bulleted list: - a = b", 5),
    "numbered": ("a numbered list: 12. a = b.", 9),
    "prose": ("prose paragraphs of 8 sentences: The value of a is b.", 19),
}
_PROSE_PARAGRAPH = 8


def _write_fact(fmt: str, a: str, b: str, index: int) -> str:
    if fmt == "lines":
        return f"{a} = {b}"
    if fmt in ("periods", "lowercase"):
        return f"{a} = {b}."
    if fmt == "bullets":
        return f"- {a} = {b}"
    if fmt == "numbered":
        return f"{index + 1}. {a} = {b}."
    return f"The value of {a} is {b}."  # prose


def random_hash(rng: random.Random, length: int = 16) -> str:
    return "".join(rng.choices(_LETTERS, k=length))


def generate_hashhop(
    target_tokens: int,
    hops: int,
    seed: int = 0,
    *,
    hash_length: int = 16,
    n_queries: int = 1,
    chain_of_thought: bool = False,
    fmt: str = "lines",
) -> SyntheticSample:
    """A HashHop document of about ``target_tokens`` tokens (``4 * target_tokens`` characters) with
    ``hops`` assignments per chain; ``n_queries`` chains are asked about; ``fmt`` is the layout of
    the facts (one of :data:`HASHHOP_FORMATS`)."""
    if fmt not in HASHHOP_FORMATS:
        raise ValueError(f"unknown HashHop format {fmt!r}; expected one of {sorted(HASHHOP_FORMATS)}")
    if hops < 1:
        raise ValueError(f"hops must be >= 1, got {hops}")
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be >= 1, got {target_tokens}")
    if hash_length < 4:
        raise ValueError(f"hash_length must be >= 4, got {hash_length}")
    rng = random.Random(f"hashhop:{seed}:{hops}:{target_tokens}")
    n_chars = target_tokens * CHARS_PER_TOKEN
    n_chains = max(n_queries, math.ceil(n_chars / ((2 * hash_length + HASHHOP_FORMATS[fmt][1]) * hops)))

    used: set[str] = set()

    def fresh() -> str:
        while True:
            h = random_hash(rng, hash_length)
            if h.lower() not in used:  # unique even after lower-casing (TF-IDF lower-cases)
                used.add(h.lower())
                return h

    chains = [[fresh() for _ in range(hops + 1)] for _ in range(n_chains)]
    if fmt == "lowercase":
        chains = [[h.lower() for h in chain] for chain in chains]
    links: list[tuple[str, str, int, int]] = []  # (a, b, chain, level)
    for c, chain in enumerate(chains):
        for lvl in range(hops):
            a, b = chain[lvl], chain[lvl + 1]
            links.append((a, f"'{b}'" if lvl == hops - 1 else b, c, lvl))
    rng.shuffle(links)
    lines = [(_write_fact(fmt, a, b, i), c, lvl) for i, (a, b, c, lvl) in enumerate(links)]

    asked = sorted(rng.sample(range(n_chains), n_queries))
    asked_set = set(asked)
    if fmt == "prose":  # sentences joined by spaces, a blank line after every 8th
        paragraphs = [lines[i : i + _PROSE_PARAGRAPH] for i in range(0, len(lines), _PROSE_PARAGRAPH)]
        parts = [assemble([(t, c in asked_set) for t, c, _ in para], sep=" ") for para in paragraphs]
        doc = "\n\n".join(text for text, _ in parts)
        spans, offset = [], 0
        for text, para_spans in parts:
            spans += [(offset + s0, offset + s1) for s0, s1 in para_spans]
            offset += len(text) + 2
    else:
        doc, spans = assemble([(t, c in asked_set) for t, c, _ in lines], sep="\n")
    # order the needles of each asked chain by hop level
    needle_of = {}
    k = 0
    for _t, c, lvl in lines:
        if c in asked_set:
            needle_of[(c, lvl)] = spans[k]
            k += 1
    needles = [needle_of[(c, lvl)] for c in asked for lvl in range(hops)]

    heads = [chains[c][0] for c in asked]
    if chain_of_thought:
        answers = [" = ".join(chains[c][1:]) for c in asked]
    else:
        answers = [chains[c][-1] for c in asked]
    if n_queries == 1:
        question = (
            f"Follow the assignments above starting from {heads[0]}: which hash does {heads[0]} "
            f"finally resolve to?"
        )
    else:
        question = "Follow the assignments above: which hash does each of these finally resolve to? " + ", ".join(heads)
    return SyntheticSample(
        task=f"hashhop_{hops}",
        document=doc,
        question=question,
        answers=answers,
        needles=needles,
        target_tokens=target_tokens,
        seed=seed,
        meta={"hops": hops, "n_chains": n_chains, "heads": heads, "chain_of_thought": chain_of_thought, "format": fmt},
    )
