"""RULER-style synthetic tasks, written from the benchmark's description (Hsieh et al., 2024, "RULER:
What's the Real Context Size of Your Long-Context Language Models?"; used by Alonso and Millidge,
2024, "Mixture-of-PageRanks: Replacing Long-Context with Real-Time, Sparse GraphRAG", Section 5) and
RULER's task table (``data/ruler/ruler_synthetic.yaml``, Apache-2.0, bundled); no code copied.

Tasks: NIAH (single_1..3, multikey_1..3, multivalue, multiquery), variable tracking (vt), common
words extraction (cwe), frequent words extraction (fwe). Haystacks: ``noise`` (a fixed five-sentence
filler, repeated), ``essay`` (Wikipedia sentences stand in for Paul Graham's essays, not
bundled), ``needle`` (distractor needles). Keys are adjective-noun words from the bundled word
lists (``data/wordlists/``), 7-digit numbers or UUIDs (drawn from the seeded RNG).

For the global tasks (cwe, fwe) ``needles`` is empty and ``answers`` holds the expected words; a
retriever is scored there with :func:`lab.synthetic.scoring.top_word_overlap`.
"""

from __future__ import annotations

import random
import uuid
from functools import lru_cache

import yaml

from lab.synthetic.common import (
    CHARS_PER_TOKEN,
    FillerStream,
    SyntheticSample,
    assemble,
    bundled_file,
    place_items,
    wikipedia_sentences,
)
from longrag.data import RULER_TASKS_YAML, WORDLISTS_DIR, data_path

__all__ = ["RULER_TASKS", "generate_ruler", "load_wordlists", "NOISE_SENTENCES"]

NOISE_SENTENCES = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)


@lru_cache(maxsize=1)
def _task_table() -> dict:
    return yaml.safe_load(data_path(RULER_TASKS_YAML).read_text(encoding="utf-8"))


RULER_TASKS = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
)


@lru_cache(maxsize=2)
def load_wordlists(root: str | None = None) -> dict[str, tuple[str, ...]]:
    """Noun, adjective and verb lists (single lower-case alphabetic words only)."""
    out = {}
    for kind, fname in (("nouns", "nounlist.txt"), ("adjectives", "adjectivelist.txt"), ("verbs", "verblist.txt")):
        words = bundled_file(f"{WORDLISTS_DIR}/{fname}", root).read_text(encoding="utf-8").split()
        out[kind] = tuple(sorted({w.lower() for w in words if w.isalpha()}))
    return out


def _seven_digits(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _word_key(rng: random.Random) -> str:
    wl = load_wordlists()
    return f"{rng.choice(wl['adjectives'])}-{rng.choice(wl['nouns'])}"


def _draw(kind: str, rng: random.Random) -> str:
    if kind == "words":
        return _word_key(rng)
    if kind == "numbers":
        return _seven_digits(rng)
    if kind == "uuids":
        return _uuid(rng)
    raise ValueError(f"unknown needle type {kind!r}; expected words, numbers or uuids")


def _needle(key: str, value: str, type_v: str) -> str:
    return f"One of the special magic {type_v} for {key} is: {value}."


def _haystack(kind: str, n_chars: int, rng: random.Random, type_k: str, type_v: str) -> list[str]:
    """Filler pieces of about ``n_chars`` characters (joined by spaces)."""
    if kind == "noise":
        out, total, i = [], 0, 0
        while total + len(NOISE_SENTENCES[i % 5]) + 1 <= n_chars:
            out.append(NOISE_SENTENCES[i % 5])
            total += len(out[-1]) + 1
            i += 1
        return out
    if kind == "essay":
        return FillerStream(wikipedia_sentences(), rng).take_chars(n_chars)
    if kind == "needle":
        out, total = [], 0
        while True:
            s = _needle(_draw(type_k, rng), _draw(type_v, rng), type_v)
            if total + len(s) + 1 > n_chars:
                return out
            out.append(s)
            total += len(s) + 1
    raise ValueError(f"unknown haystack type {kind!r}; expected noise, essay or needle")


def _depths(n: int, rng: random.Random) -> list[float]:
    grid = [i / 39 for i in range(40)]  # evenly spaced 0..100 % depths
    return sorted(rng.sample(grid, n)) if n <= len(grid) else sorted(rng.choice(grid) for _ in range(n))


def _insert(haystack: list[str], items: list[tuple[str, bool]], rng: random.Random, depths: list[float] | None):
    slots = place_items(len(haystack), len(items), rng, depths)
    pieces: list[tuple[str, bool]] = []
    k = 0
    for i in range(len(haystack) + 1):
        while k < len(slots) and slots[k] == i:
            pieces.append(items[k])
            k += 1
        if i < len(haystack):
            pieces.append((haystack[i], False))
    return assemble(pieces)


def _niah(name: str, args: dict, target_tokens: int, seed: int, rng: random.Random) -> SyntheticSample:
    type_k, type_v = args["type_needle_k"], args["type_needle_v"]
    n_k, n_v, n_q = int(args["num_needle_k"]), int(args["num_needle_v"]), int(args["num_needle_q"])
    n_k = max(n_k, n_q)
    keys: list[str] = []
    while len(keys) < n_k:
        k = _draw(type_k, rng)
        if k not in keys:
            keys.append(k)
    values = [[_draw(type_v, rng) for _ in range(n_v)] for _ in keys]
    asked = sorted(rng.sample(range(n_k), n_q))
    needles = [(_needle(keys[i], v, type_v), i in asked) for i in range(n_k) for v in values[i]]
    rng.shuffle(needles)
    need_chars = sum(len(t) + 1 for t, _ in needles)
    hay = _haystack(args["type_haystack"], target_tokens * CHARS_PER_TOKEN - need_chars, rng, type_k, type_v)
    doc, spans = _insert(hay, needles, rng, _depths(len(needles), rng))
    asked_keys = [keys[i] for i in asked]
    key_text = ", ".join(asked_keys[:-1]) + (" and " if len(asked_keys) > 1 else "") + asked_keys[-1]
    question = f"What are all the special magic {type_v} for {key_text} mentioned in the provided text?"
    return SyntheticSample(
        task=name,
        document=doc,
        question=question,
        answers=[v for i in asked for v in values[i]],
        needles=spans,
        target_tokens=target_tokens,
        seed=seed,
        meta={"keys": keys, "asked": asked_keys, "haystack": args["type_haystack"]},
    )


def _var_name(rng: random.Random) -> str:
    return "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=5))


def _vt(name: str, args: dict, target_tokens: int, seed: int, rng: random.Random) -> SyntheticSample:
    n_chains, n_hops = int(args["num_chains"]), int(args["num_hops"])
    used: set[str] = set()
    items: list[tuple[str, bool]] = []
    answers: list[str] = []
    value0 = ""
    for c in range(n_chains):
        names = []
        while len(names) < n_hops + 1:
            v = _var_name(rng)
            if v not in used:
                used.add(v)
                names.append(v)
        value = str(rng.randint(10_000, 99_999))
        chain = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, n_hops + 1)]
        items += [(s, c == 0) for s in chain]
        if c == 0:
            answers, value0 = names, value
    need_chars = sum(len(t) + 1 for t, _ in items)
    hay = _haystack(args["type_haystack"], target_tokens * CHARS_PER_TOKEN - need_chars, rng, "words", "numbers")
    # chains keep their order: insertion points are sorted, items are in chain order
    doc, spans = _insert(hay, items, rng, None)
    question = f"Find all variables that are assigned the value {value0} in the text above."
    return SyntheticSample(
        task=name, document=doc, question=question, answers=answers, needles=spans[: n_hops + 1],
        target_tokens=target_tokens, seed=seed, meta={"value": value0, "n_chains": n_chains},
    )  # fmt: skip


def _cwe(name: str, args: dict, target_tokens: int, seed: int, rng: random.Random) -> SyntheticSample:
    freq_cw, freq_ucw, num_cw = int(args["freq_cw"]), int(args["freq_ucw"]), int(args["num_cw"])
    wl = load_wordlists()
    vocab = sorted(set(wl["nouns"]) | set(wl["adjectives"]) | set(wl["verbs"]))
    rng.shuffle(vocab)
    common = vocab[:num_cw]
    # enough entries to reach the target length ("N. word " ~ 12 characters per entry). When the
    # word lists run out, uncommon words repeat more often and common words scale along, keeping
    # RULER's ratio (freq_cw / freq_ucw = 10 by default).
    n_entries = max(num_cw * freq_cw, target_tokens * CHARS_PER_TOKEN // 12)
    n_ucw = max(1, (n_entries - num_cw * freq_cw) // freq_ucw)
    if num_cw + n_ucw > len(vocab):
        n_ucw = len(vocab) - num_cw
        scale = -(-n_entries // (num_cw * freq_cw + n_ucw * freq_ucw))
        freq_cw, freq_ucw = freq_cw * scale, freq_ucw * scale
    uncommon = vocab[num_cw : num_cw + n_ucw]
    words = common * freq_cw + uncommon * freq_ucw
    rng.shuffle(words)
    doc = " ".join(f"{i}. {w}" for i, w in enumerate(words, 1))
    question = (
        "Above is a numbered list of words. Which 10 words appear most often in it? Answer with the words only."
    )
    return SyntheticSample(
        task=name, document=doc, question=question, answers=common, needles=[], target_tokens=target_tokens,
        seed=seed, meta={"freq_cw": freq_cw, "freq_ucw": freq_ucw},
    )  # fmt: skip


def _fwe(name: str, args: dict, target_tokens: int, seed: int, rng: random.Random) -> SyntheticSample:
    alpha = float(args["alpha"])
    n_chars = target_tokens * CHARS_PER_TOKEN
    vocab_size = 1000
    coded: list[str] = []
    seen: set[str] = set()
    while len(coded) < vocab_size:
        w = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 6)))
        if w not in seen:
            seen.add(w)
            coded.append(w)
    weights = [1.0 / (r**alpha) for r in range(1, vocab_size + 1)]
    out: list[str] = []
    total = 0
    batch = 4096
    while total < n_chars:
        for w in rng.choices(coded, weights=weights, k=batch):
            out.append(w)
            total += len(w) + 1
            if total >= n_chars:
                break
    # sentences of 12 words each, so the chunker sees text-like pieces
    lines = [" ".join(out[i : i + 12]) + "." for i in range(0, len(out), 12)]
    doc = " ".join(lines)
    counts: dict[str, int] = {}
    for w in out:
        counts[w] = counts.get(w, 0) + 1
    top = sorted(counts, key=lambda w: (-counts[w], w))[:3]
    question = "Above is a text of coded words. Which 3 words occur most often in it? Answer with the words only."
    return SyntheticSample(
        task=name, document=doc, question=question, answers=top, needles=[], target_tokens=target_tokens,
        seed=seed, meta={"alpha": alpha},
    )  # fmt: skip


_KINDS = {"niah": _niah, "variable_tracking": _vt, "common_words_extraction": _cwe, "freq_words_extraction": _fwe}


def generate_ruler(task: str, target_tokens: int, seed: int = 0) -> SyntheticSample:
    """A RULER-style sample of task ``task`` (one of ``RULER_TASKS``) of about ``target_tokens``."""
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be >= 1, got {target_tokens}")
    table = _task_table()
    if task not in RULER_TASKS or task not in table:
        raise ValueError(f"unknown RULER task {task!r}; expected one of {list(RULER_TASKS)} (QA tasks are not generated)")
    spec = table[task]
    rng = random.Random(f"ruler:{task}:{seed}:{target_tokens}")
    return _KINDS[spec["task"]](task, spec["args"], target_tokens, seed, rng)
