"""User corpora: JSONL/parquet readers with counted bad records, and the Arrow document table."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longrag.corpus.documents import (
    DOCUMENT_SCHEMA,
    documents_to_table,
    guess_format,
    read_documents,
    read_jsonl,
    read_parquet,
    record_to_document,
    split_dpr_contents,
)
from longrag.corpus.report import ReadReport
from longrag.data import DPR_PASSAGES, data_path
from longrag.types import Document

DPR = data_path(DPR_PASSAGES)  # the bundled 1,000 DPR passages, gzipped (data/README.md)


def test_split_dpr_contents() -> None:
    assert split_dpr_contents('"Evan Morris"\nEvan Morris was a lobbyist.') == ("Evan Morris", "Evan Morris was a lobbyist.")
    assert split_dpr_contents("Absalon\ndragged forth.") == ("Absalon", "dragged forth.")  # unquoted variant
    assert split_dpr_contents("no title here") == (None, "no title here")
    assert split_dpr_contents('"Only title"\n  ') == (None, '"Only title"\n  ')
    long_first = "word " * 100 + "\nsecond"
    assert split_dpr_contents(long_first) == (None, long_first)


def test_record_to_document_variants() -> None:
    d = record_to_document({"doc_id": "a", "title": "A", "text": " body ", "links": ["B"]})
    assert d == Document("a", "A", "body", ["B"])
    d = record_to_document({"id": 7, "contents": '"Seven"\nThe number.'})
    assert d == Document("7", "Seven", "The number.", [])
    # a title field wins: contents are kept whole
    d = record_to_document({"id": "x", "title": "T", "contents": '"Q"\nbody'})
    assert d.title == "T" and d.text == '"Q"\nbody'
    d = record_to_document({"id": "y", "text": "plain"})
    assert d.title == "" and d.text == "plain"


def _write_jsonl(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_jsonl_bad_lines_are_counted(tmp_path: Path) -> None:
    lines = [
        json.dumps({"doc_id": "1", "title": "One", "text": "first", "links": ["Two"]}),  # 1 ok
        "{not json",  # 2 bad JSON
        json.dumps({"doc_id": "2", "title": "Two"}),  # 3 missing text
        "",  # 4 blank: skipped, not bad
        json.dumps({"id": 3, "contents": '"Three"\nthird'}),  # 5 ok (DPR style)
        json.dumps(["a", "list"]),  # 6 not an object
        json.dumps({"title": "No id", "text": "x"}),  # 7 missing id
        json.dumps({"doc_id": "1", "text": "again"}),  # 8 duplicate id
        json.dumps({"doc_id": "4", "text": "t", "links": "Two"}),  # 9 links not a list
        json.dumps({"doc_id": "5", "text": "   "}),  # 10 empty text
        json.dumps({"doc_id": "6", "text": "t", "title": 5}),  # 11 title not a string
        json.dumps({"doc_id": "7", "text": "seventh"}),  # 12 ok
    ]
    p = tmp_path / "docs.jsonl"
    _write_jsonl(p, lines)
    docs, rep = read_jsonl(p)
    assert [d.doc_id for d in docs] == ["1", "3", "7"]
    assert docs[1].title == "Three" and docs[1].text == "third"
    assert rep.n_ok == 3 and rep.n_bad == 8
    assert rep.stats["blank_lines"] == 1
    reasons = {b.line: b.reason for b in rep.bad}
    assert set(reasons) == {2, 3, 6, 7, 8, 9, 10, 11}
    assert "invalid JSON" in reasons[2]
    assert "missing text" in reasons[3] and "missing text" in reasons[10]
    assert "not an object" in reasons[6]
    assert "doc_id" in reasons[7]
    assert "duplicate" in reasons[8] and "line 1" in reasons[8]
    assert "links" in reasons[9]
    assert "title" in reasons[11]
    assert "8 bad" in rep.summary()


def test_jsonl_bad_examples_capped(tmp_path: Path) -> None:
    p = tmp_path / "many.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as fh:
        for i in range(50):
            fh.write("oops\n" if i % 2 else json.dumps({"id": i, "text": f"t{i}"}) + "\n")
    docs, rep = read_documents(p)  # format guessed from .jsonl.gz
    assert rep.fmt == "jsonl" and len(docs) == rep.n_ok == 25
    assert rep.n_bad == 25 and len(rep.bad) == 20
    assert [b.line for b in rep.bad] == list(range(2, 41, 2))
    assert "and 5 more" in rep.summary()


def test_real_dpr_passages() -> None:
    docs, rep = read_documents(DPR, "jsonl")
    assert rep.n_ok == 1000 and rep.n_bad == 0
    assert docs[0].title == "Evan Morris" and docs[0].text.startswith("Evan Morris Evan L. Morris")
    assert all(d.title and not d.title.startswith('"') and "\n" not in d.title for d in docs)
    by_id = {d.doc_id: d for d in docs}
    assert sum(d.title == "Absalon" for d in docs) >= 3  # unquoted "Title\ntext" records too
    assert len(by_id) == 1000


def test_parquet_roundtrip(tmp_path: Path) -> None:
    docs = [
        Document("1", "Alpha", "alpha text", ["Beta", "Gamma"]),
        Document("2", "Beta", "béta — unicode ✓", []),
        Document("3", "", "no title", ["Alpha"]),
    ]
    table = documents_to_table(docs)
    assert table.schema.equals(DOCUMENT_SCHEMA)
    p = tmp_path / "docs.parquet"
    pq.write_table(table, p)
    back, rep = read_documents(p, "parquet")
    assert back == docs and rep.n_ok == 3 and rep.n_bad == 0
    assert pq.read_schema(p).field("links").type == pa.list_(pa.string())


def test_parquet_user_columns_and_bad_rows(tmp_path: Path) -> None:
    t = pa.table(
        {
            "id": pa.array([10, 11, 12, 10], pa.int64()),
            "contents": ['"Ten"\nten text', None, '"Twelve"\ntwelve', '"Dup"\nx'],
        }
    )
    p = tmp_path / "user.parquet"
    pq.write_table(t, p)
    docs, rep = read_parquet(p)
    assert [(d.doc_id, d.title, d.text) for d in docs] == [("10", "Ten", "ten text"), ("12", "Twelve", "twelve")]
    assert rep.n_bad == 2 and [b.line for b in rep.bad] == [2, 4]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"name": ["x"]}), bad)
    with pytest.raises(ValueError, match="doc_id"):
        read_parquet(bad)


def test_read_documents_dispatch_errors(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    _write_jsonl(p, [json.dumps({"id": 1, "text": "x"})])
    with pytest.raises(ValueError, match="fmt"):
        read_documents(p, "csv")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lead"):
        read_documents(p, "jsonl", text_mode="lead")
    with pytest.raises(FileNotFoundError):
        read_documents(tmp_path / "missing.jsonl", "jsonl")
    assert guess_format("a/b.xml.bz2") == "wikixml" and guess_format("x.parquet") == "parquet"
    with pytest.raises(ValueError, match="cannot tell"):
        guess_format("x.txt")


def test_report_to_dict() -> None:
    r = ReadReport(source="s", fmt="jsonl", max_examples=1)
    r.add_bad(3, "bad one")
    r.add_bad(4, "bad two")
    d = r.to_dict()
    assert d["n_bad"] == 2 and d["bad"] == [{"line": 3, "reason": "bad one", "record": None}]


def test_sources_are_read_from_s3_like_local_files(tmp_path: Path) -> None:
    """Issue 9: ``--source s3://...`` failed (the readers tested ``Path.exists()``); JSONL, gzipped
    JSONL and parquet objects are now read through the storage layer, same documents as locally."""
    import boto3

    from tests.s3server import moto_s3

    docs = [Document("1", "Alpha", "alpha text é", ["Beta"]), Document("2", "Beta", "beta text", [])]
    lines = [json.dumps(d.to_row()) for d in docs] + ["{not json"]
    local = {"docs.jsonl": tmp_path / "docs.jsonl", "docs.jsonl.gz": tmp_path / "docs.jsonl.gz",
             "docs.parquet": tmp_path / "docs.parquet"}
    _write_jsonl(local["docs.jsonl"], lines)
    with gzip.open(local["docs.jsonl.gz"], "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    pq.write_table(documents_to_table(docs), local["docs.parquet"])
    with moto_s3("corpora") as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        for name, path in local.items():
            client.upload_file(str(path), "corpora", f"user/{name}")
        for name, path in local.items():
            uri = f"s3://corpora/user/{name}"
            got, rep = read_documents(uri)
            want, _ = read_documents(path)
            assert got == want == docs
            assert rep.source == uri and rep.n_bad == (0 if name.endswith("parquet") else 1)
        with pytest.raises(FileNotFoundError, match="s3://corpora/user/missing.jsonl"):
            read_documents("s3://corpora/user/missing.jsonl")
