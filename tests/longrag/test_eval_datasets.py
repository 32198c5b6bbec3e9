"""Loaders and pooled corpora: real sample files (counts checked independently) and malformed input."""

import collections
import gzip
import json

import pytest

from longrag.data import (
    DPR_PASSAGES,
    HOTPOTQA_CORPUS,
    HOTPOTQA_SAMPLE,
    MUSIQUE_CORPUS,
    MUSIQUE_SAMPLE,
    NQ_OPEN_SAMPLE,
    TWOWIKI_EXAMPLE,
    data_path,
    read_text,
)
from longrag.eval import corpus as C
from longrag.eval import datasets as D


def first_of(pooled) -> dict:
    """Title -> the first document of that title."""
    out: dict = {}
    for d in pooled.documents:
        out.setdefault(d.title, d)
    return out


def _raw(rel):
    return json.loads(read_text(data_path(rel)))


def test_hotpotqa_loader_matches_raw_file():
    raw = _raw(HOTPOTQA_SAMPLE)
    res = D.load_qa(data_path(HOTPOTQA_SAMPLE))
    assert res.format == "hotpotqa" and res.n_malformed == 0
    assert len(res.examples) == len(raw) == 100
    for ex, r in zip(res.examples, raw):
        assert ex.qid == r["_id"] and ex.answers == [r["answer"]] and ex.type == r["type"]
        assert set(ex.gold_titles) == {t for t, _ in r["supporting_facts"]}
        assert [p.title for p in ex.paragraphs] == [c[0] for c in r["context"]]
        assert {p.title for p in ex.paragraphs if p.is_supporting} == set(ex.gold_titles)
    # HotpotQA sentences carry their own leading space: joining must not double or drop spaces
    ex0, r0 = res.examples[0], raw[0]
    assert ex0.paragraphs[0].text == "".join(r0["context"][0][1]).strip()
    assert "  " not in ex0.paragraphs[0].text
    assert collections.Counter(e.type for e in res.examples) == {"bridge": 78, "comparison": 22}


def test_hotpotqa_pooled_equals_corpus_file():
    res = D.load_hotpotqa(data_path(HOTPOTQA_SAMPLE))
    pooled = C.pool_examples(res.examples)
    n_ctx = sum(len(r["context"]) for r in _raw(HOTPOTQA_SAMPLE))
    assert pooled.n_paragraphs == n_ctx
    assert len(pooled.documents) == 994  # README: 994 distinct paragraphs
    cf = C.load_corpus_file(data_path(HOTPOTQA_CORPUS))
    assert cf.n_malformed == 0 and len(cf.documents) == 994
    a = {d.doc_id: (d.title, d.text) for d in pooled.documents}
    b = {d.doc_id: (d.title, d.text) for d in cf.documents}
    assert a == b  # stable title-hash ids and identical text in both forms


def test_musique_loader_and_pool_conflicts():
    raw = _raw(MUSIQUE_SAMPLE)
    res = D.load_musique(data_path(MUSIQUE_SAMPLE))
    assert len(res.examples) == 100 and res.n_malformed == 0
    ex, r = res.examples[0], raw[0]
    assert ex.answers[0] == r["answer"] and set(r["answer_aliases"]) <= set(ex.answers)
    assert ex.gold_titles == list(dict.fromkeys(p["title"] for p in r["paragraphs"] if p["is_supporting"]))
    assert ex.type == r["id"].split("__")[0]
    by_title = collections.defaultdict(set)
    for q in raw:
        for p in q["paragraphs"]:
            by_title[p["title"]].add(" ".join(p["paragraph_text"].split()))
    n_conflicts = sum(1 for v in by_title.values() if len(v) > 1)
    pooled = C.pool_examples(res.examples)
    assert pooled.n_paragraphs == sum(len(q["paragraphs"]) for q in raw)
    assert len(pooled.documents) == len(by_title)
    assert pooled.n_duplicates_merged == pooled.n_paragraphs - len(by_title)
    assert pooled.n_conflicting_titles == n_conflicts > 0
    # every distinct text of a conflicting title is inside its merged document
    docs = {d.title: d for d in pooled.documents}
    for title, texts in by_title.items():
        merged = " ".join(docs[title].text.split())
        assert all(t in merged for t in texts)
    sep = C.pool_examples(res.examples, on_conflict="separate")
    assert len(sep.documents) == sum(len(v) for v in by_title.values())
    assert len({d.doc_id for d in sep.documents}) == len(sep.documents)
    first = C.pool_examples(res.examples, on_conflict="first")
    assert len(first.documents) == len(by_title)
    cf = C.load_corpus_file(data_path(MUSIQUE_CORPUS))
    assert cf.n_paragraphs == 1890 and len(cf.documents) == len(by_title)


def test_2wiki_nq_dpr_loaders():
    w = D.load_qa(data_path(TWOWIKI_EXAMPLE))
    assert w.format == "2wiki" and len(w.examples) == 2
    assert w.examples[0].gold_titles == ["Lothair II", "Ermengarde of Tours"]
    assert w.examples[0].answers == ["20 March 851"] and w.examples[0].meta["evidences"]
    # 2Wiki sentences have no leading space: they are joined with one
    t = w.examples[0].paragraphs[0].text
    assert "Lothair II. She was" in t
    nq = D.load_qa(data_path(NQ_OPEN_SAMPLE))
    assert nq.format == "nq_open" and len(nq.examples) == 1800 and nq.n_malformed == 0
    assert nq.examples[2].answers == ["Salzburg, Austria", "Austria"]
    dpr = C.load_dpr_passages(data_path(DPR_PASSAGES))
    assert len(dpr.documents) == 1000 and dpr.n_malformed == 0
    assert dpr.documents[0].doc_id == "0" and dpr.documents[0].title == "Evan Morris"
    assert not dpr.documents[0].text.startswith('"')


def test_malformed_records_are_counted(tmp_path):
    good = {"_id": "q1", "question": "Q?", "answer": "A", "type": "bridge", "supporting_facts": [["T1", 0]],
            "context": [["T1", ["Sent one.", " Sent two."]], ["T2", ["Other."]]]}
    bad_ctx = dict(good, _id="q2", context=[["T1"]])
    no_q = {k: v for k, v in good.items() if k != "question"}
    p = tmp_path / "h.json"
    p.write_text(json.dumps([good, bad_ctx, no_q, "not a record", dict(good, _id="q5")]))
    res = D.load_hotpotqa(p)
    assert [e.qid for e in res.examples] == ["q1", "q5"]
    assert res.n_records == 5 and res.n_malformed == 3 and len(res.errors) == 3
    assert res.examples[0].paragraphs[0].text == "Sent one. Sent two."
    assert res.examples[0].supporting == [("T1", 0)]


def test_jsonl_gz_bad_lines_and_detection(tmp_path):
    p = tmp_path / "nq.jsonl.gz"
    lines = [json.dumps({"question": "who?", "answer": ["me"]}), "{broken", "", json.dumps({"question": "x"}),
             json.dumps({"question": "why?", "answer": "because"})]
    with gzip.open(p, "wt") as fh:
        fh.write("\n".join(lines))
    res = D.load_qa(p)
    assert res.format == "nq_open"
    assert [e.answers for e in res.examples] == [["me"], ["because"]]
    assert res.n_malformed == 2  # the broken JSON line and the record without answer


def test_longbench_loader(tmp_path):
    p = tmp_path / "lb.jsonl"
    rec = {"input": "Who?", "context": "Passage 1:\nA\nlong text", "answers": ["Ann", "Anne"],
           "length": 4, "dataset": "hotpotqa", "language": "en", "all_classes": None, "_id": "x1"}
    p.write_text(json.dumps(rec) + "\n" + json.dumps({"input": "no answers", "context": "c", "answers": []}) + "\n")
    res = D.load_qa(p)
    assert res.format == "longbench" and res.n_malformed == 1
    ex = res.examples[0]
    assert ex.qid == "x1" and ex.answers == ["Ann", "Anne"] and ex.meta["context"].startswith("Passage 1")
    assert ex.type == "hotpotqa"


def test_unknown_format_and_missing_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps([{"foo": 1}]))
    with pytest.raises(ValueError, match="could not detect"):
        D.load_qa(p)
    with pytest.raises(FileNotFoundError):
        D.load_qa(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="unknown format"):
        D.load_qa(p, fmt="squad")  # type: ignore[arg-type]


def test_pool_paragraphs_policies_and_ids():
    pars = [("A", "alpha text"), ("B", "beta"), ("A", "alpha   text"), ("A", "another alpha"), ("C", "c")]
    pc = C.pool_paragraphs(pars)
    assert [d.title for d in pc.documents] == ["A", "B", "C"]
    assert pc.n_duplicates_merged == 2 and pc.n_conflicting_titles == 1
    assert first_of(pc)["A"].text == "alpha text\n\nanother alpha"
    assert pc.documents[0].doc_id == C.title_doc_id("A")
    # ids do not depend on order
    rev = C.pool_paragraphs(list(reversed(pars)))
    assert {d.title: d.doc_id for d in rev.documents} == {d.title: d.doc_id for d in pc.documents}
    assert first_of(C.pool_paragraphs(pars, "first"))["A"].text == "alpha text"
    sep = C.pool_paragraphs(pars, "separate")
    assert [d.doc_id for d in sep.documents if d.title == "A"] == [C.title_doc_id("A"), C.title_doc_id("A") + "#2"]
    with pytest.raises(ValueError):
        C.pool_paragraphs(pars, "merge")  # type: ignore[arg-type]


def test_corpus_file_malformed_rows(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps([{"title": "A", "text": "a"}, {"title": "B"}, {"title": 3, "text": "x"}, {"title": "C", "paragraph_text": "c"}]))
    pc = C.load_corpus_file(p)
    assert [d.title for d in pc.documents] == ["A", "C"] and pc.n_malformed == 2
    q = tmp_path / "d.json"
    q.write_text(json.dumps({"A": ["One.", " Two."], "B": "plain", "C": 5}))
    pc = C.load_corpus_file(q)
    assert first_of(pc)["A"].text == "One. Two." and first_of(pc)["B"].text == "plain" and pc.n_malformed == 1


def test_dpr_contents_parsing(tmp_path):
    assert C.parse_dpr_contents('"Aaron"\nAaron is a prophet.') == ("Aaron", "Aaron is a prophet.")
    assert C.parse_dpr_contents('Plain title\ntext') == ("Plain title", "text")
    p = tmp_path / "dpr.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in [
        {"id": "1", "contents": '"T"\ntext one'}, {"id": "2", "contents": "no newline"},
        {"id": "1", "contents": '"T"\ndup id'}, {"id": "3", "contents": '"T"\ntext two'}]))
    pc = C.load_dpr_passages(p)
    assert [d.doc_id for d in pc.documents] == ["1", "3"] and pc.n_malformed == 2 and pc.n_shared_titles == 1
