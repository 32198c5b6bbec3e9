"""Synthetic generators (HashHop, BABILong-style, RULER-style) and retrieval scoring."""

from __future__ import annotations

import re

import numpy as np
import pytest

from lab.synthetic import (
    RULER_TASKS,
    generate_babilong,
    generate_hashhop,
    generate_ruler,
    load_babi,
    needle_recall,
    top_word_overlap,
)
from lab.synthetic.babilong import parse_babi
from lab.synthetic.scoring import needles_found
from longrag.mixpr import chunk_text


@pytest.mark.parametrize("hops", [1, 3, 6])
def test_hashhop_chain_and_needles(hops):
    s = generate_hashhop(4000, hops, seed=1)
    assert abs(s.n_tokens - 4000) / 4000 < 0.1
    lines = s.document.split("\n")
    pairs = {}
    for ln in lines:
        m = re.fullmatch(r"([A-Za-z]{16}) = '?([A-Za-z]{16})'?", ln)
        assert m, ln
        pairs[m.group(1)] = m.group(2)
    # follow the chain from the asked head: hops steps to the answer
    h = s.meta["heads"][0]
    for _ in range(hops):
        h = pairs[h]
    assert h == s.answers[0] and h not in pairs
    assert s.meta["heads"][0] in s.question
    texts = s.needle_texts()
    assert len(texts) == hops and texts[0].startswith(s.meta["heads"][0]) and texts[-1].endswith(f"'{s.answers[0]}'")
    assert generate_hashhop(4000, hops, seed=1).document == s.document
    assert generate_hashhop(4000, hops, seed=2).document != s.document


_FACT = {
    "lines": r"(?P<a>[A-Za-z]{16}) = (?P<b>'?[A-Za-z]{16}'?)",
    "periods": r"(?P<a>[A-Za-z]{16}) = (?P<b>'?[A-Za-z]{16}'?)\.",
    "lowercase": r"(?P<a>[a-z]{16}) = (?P<b>'?[a-z]{16}'?)\.",
    "bullets": r"- (?P<a>[A-Za-z]{16}) = (?P<b>'?[A-Za-z]{16}'?)",
    "numbered": r"\d+\. (?P<a>[A-Za-z]{16}) = (?P<b>'?[A-Za-z]{16}'?)\.",
    "prose": r"The value of (?P<a>[A-Za-z]{16}) is (?P<b>'?[A-Za-z]{16}'?)\.",
}


@pytest.mark.parametrize("fmt", sorted(_FACT))
def test_hashhop_formats_write_the_same_kind_of_chain(fmt):
    """Issue 9: the HashHop facts in each document format of the MixPR format benchmark: the needles
    are whole facts in that layout, they chain from the asked head to the answer, and the length
    target holds."""
    from lab.synthetic.hashhop import HASHHOP_FORMATS

    assert set(HASHHOP_FORMATS) == set(_FACT)
    s = generate_hashhop(4000, 4, seed=3, fmt=fmt)
    assert abs(s.n_tokens - 4000) / 4000 < 0.1 and s.meta["format"] == fmt
    pairs = {}
    for fact in re.split(r"\n\n|\n| (?=The value)", s.document):
        m = re.fullmatch(_FACT[fmt], fact)
        assert m, (fmt, fact)
        pairs[m.group("a")] = m.group("b").strip("'")
    h = s.meta["heads"][0]
    for text in s.needle_texts():
        m = re.fullmatch(_FACT[fmt], text)
        assert m and m.group("a") == h, (fmt, text)
        h = pairs[h]
    assert h == s.answers[0]
    if fmt == "prose":
        assert "\n\n" in s.document and "\n" not in s.document.replace("\n\n", "")
    with pytest.raises(ValueError, match="unknown HashHop format 'poem'"):
        generate_hashhop(4000, 4, fmt="poem")


def test_parse_babi_supporting_facts():
    text = "1 Mary moved to the bathroom.\n2 John went to the hallway.\n3 Where is Mary? \tbathroom\t1\n" \
           "4 Daniel went back to the hallway.\n5 Where is Daniel? \thallway\t4\n1 Sandra left.\n2 Where is Sandra?\tgarden\t1\n"
    qs = parse_babi(text)
    assert [q.answer for q in qs] == ["bathroom", "hallway", "garden"]
    assert qs[1].facts[qs[1].supporting[0]] == "Daniel went back to the hallway."
    assert qs[2].facts == ("Sandra left.",)


@pytest.mark.parametrize("task", ["qa1", "qa2", "qa3", "qa4", "qa5"])
def test_babilong_sample(task):
    s = generate_babilong(task, 8000, seed=5)
    assert abs(s.n_tokens - 8000) / 8000 < 0.05
    bq = load_babi(task)[s.meta["question_index"]]
    assert s.question == bq.question and s.answers == [bq.answer]
    assert s.needle_texts() == [bq.facts[i] for i in bq.supporting]
    # every fact is present, in the original order
    pos = [s.document.find(f) for f in bq.facts]
    assert all(p >= 0 for p in pos)
    assert generate_babilong(task, 8000, seed=5).document == s.document


@pytest.mark.parametrize("task", RULER_TASKS)
def test_ruler_tasks(task):
    s = generate_ruler(task, 4000, seed=0)
    assert 0.8 < s.n_tokens / 4000 < 1.1, s.n_tokens
    assert s.answers
    if task.startswith("niah"):
        for v in s.answers:
            assert v in s.document
        for t in s.needle_texts():
            assert t.startswith("One of the special magic") and t.endswith(".")
        n_expected = {"niah_multivalue": 4, "niah_multiquery": 4}.get(task, 1)
        assert len(s.needles) == n_expected
        for key in s.meta["asked"]:
            assert key in s.question
    elif task == "vt":
        assert len(s.answers) == 5 and len(s.needles) == 5
        assert s.needle_texts()[0] == f"VAR {s.answers[0]} = {s.meta['value']}."
        assert s.meta["value"] in s.question
    elif task == "cwe":
        words = re.findall(r"\d+\. (\S+)", s.document)
        counts = {w: words.count(w) for w in set(words)}
        top = sorted(counts, key=lambda w: -counts[w])[:10]
        assert set(top) == set(s.answers)
    elif task == "fwe":
        assert len(s.answers) == 3 and s.needles == []


def test_ruler_long_cwe_scales_frequencies():
    s = generate_ruler("cwe", 200_000, seed=1)
    words = re.findall(r"\d+\. (\S+)", s.document)
    from collections import Counter

    c = Counter(words)
    assert {w for w, _ in c.most_common(10)} == set(s.answers)


def test_needle_recall():
    doc = "Alpha one. Beta two. Gamma three. Delta four."
    ch = chunk_text(doc)
    needles = [(doc.index("Beta"), doc.index("Beta") + len("Beta two.")), (doc.index("Delta"), len(doc))]
    assert needle_recall(needles, ch.starts, ch.ends, [1, 3]) == 1.0
    assert needle_recall(needles, ch.starts, ch.ends, [1]) == 0.5
    assert needle_recall(needles, ch.starts, ch.ends, []) == 0.0
    # a needle spanning two chunks needs both
    span = [(doc.index("Beta"), doc.index("Gamma") + 5)]
    assert needles_found(span, ch.starts, ch.ends, [1]) == [False]
    assert needles_found(span, ch.starts, ch.ends, [1, 2]) == [True]
    assert needle_recall([], ch.starts, ch.ends, []) == 1.0


def test_top_word_overlap():
    assert top_word_overlap("a b b c c c d d d d", "d c b", n=3) == 1.0
    assert top_word_overlap("x x x y y z", "z", n=2) == 0.0
    assert np.isclose(top_word_overlap("x x x y y z", "x", n=2), 0.5)


def test_wikilike_corpus_files_read_back_and_link(tmp_path):
    from lab.synthetic.wikigraph import wikilike_graph, write_wikilike_corpus
    from longrag.corpus.documents import read_jsonl
    from longrag.index.grouping import build_adjacency

    paths = write_wikilike_corpus(tmp_path, 300, n_files=3, mean_links=5, seed=4)
    assert [p.name for p in paths] == ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    docs = []
    for p in paths:
        part, report = read_jsonl(p)
        assert report.n_bad == 0
        docs.extend(part)
    assert [d.doc_id for d in docs] == [f"w{i}" for i in range(300)]
    assert len({d.title for d in docs}) == 300
    graph = wikilike_graph(300, mean_links=5, seed=4)
    # every generated link resolves to the article the graph links to (self-links dropped)
    adj = build_adjacency(docs, symmetric=False)
    want = [sorted({int(b) for a, b in zip(graph.src, graph.dst) if a == i and b != i}) for i in range(300)]
    assert adj == want
    # texts are long enough for their token counts (about 4 characters per token)
    assert all(len(d.text) >= 4 * int(t) for d, t in zip(docs, graph.n_tokens))
