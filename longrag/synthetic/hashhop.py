"""HashHop-style multi-hop generator, written from the recipe of Magic's hash-hop benchmark
(github.com/magicproduct/hash-hop, MIT; used by Alonso and Millidge, 2024, "Mixture-of-PageRanks:
Replacing Long-Context with Real-Time, Sparse GraphRAG", Section 5 and Appendix A.2); no code copied.

The document is a shuffled list of assignment lines ``a = b`` between random 16-letter hashes,
forming chains ``h0 -> h1 -> ... -> hH``; the last link of each chain is written with quotes
(``h(H-1) = 'hH'``). The question names ``h0``; the answer is ``hH`` (or the whole chain with
chain of thought). The supporting facts (``needles``) are the H lines of the queried chain.
"""

from __future__ import annotations

import math
import random
import string

from longrag.synthetic.common import CHARS_PER_TOKEN, SyntheticSample, assemble

__all__ = ["generate_hashhop", "random_hash"]

_LETTERS = string.ascii_letters


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
) -> SyntheticSample:
    """A HashHop document of about ``target_tokens`` tokens (``4 * target_tokens`` characters) with
    ``hops`` assignments per chain; ``n_queries`` chains are asked about."""
    if hops < 1:
        raise ValueError(f"hops must be >= 1, got {hops}")
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be >= 1, got {target_tokens}")
    if hash_length < 4:
        raise ValueError(f"hash_length must be >= 4, got {hash_length}")
    rng = random.Random(f"hashhop:{seed}:{hops}:{target_tokens}")
    n_chars = target_tokens * CHARS_PER_TOKEN
    n_chains = max(n_queries, math.ceil(n_chars / ((2 * hash_length + 3) * hops)))

    used: set[str] = set()

    def fresh() -> str:
        while True:
            h = random_hash(rng, hash_length)
            if h.lower() not in used:  # unique even after lower-casing (TF-IDF lower-cases)
                used.add(h.lower())
                return h

    chains = [[fresh() for _ in range(hops + 1)] for _ in range(n_chains)]
    lines: list[tuple[str, int, int]] = []  # (text, chain, level)
    for c, chain in enumerate(chains):
        for lvl in range(hops):
            a, b = chain[lvl], chain[lvl + 1]
            text = f"{a} = '{b}'" if lvl == hops - 1 else f"{a} = {b}"
            lines.append((text, c, lvl))
    rng.shuffle(lines)

    asked = sorted(rng.sample(range(n_chains), n_queries))
    asked_set = set(asked)
    doc, spans = assemble([(t, c in asked_set) for t, c, _ in lines], sep="\n")
    # order the needles of each asked chain by hop level
    needle_of = {}
    k = 0
    for t, c, lvl in lines:
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
        meta={"hops": hops, "n_chains": n_chains, "heads": heads, "chain_of_thought": chain_of_thought},
    )
