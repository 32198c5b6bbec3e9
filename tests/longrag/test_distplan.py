"""The driver's document metadata of a distributed build (Ray-free): Arrow-backed ids and titles,
corpus order and duplicate ids against a plain-Python reference."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from longrag.index.distplan import DocMeta, order_documents


def reference_order(meta_rows: list[dict], fmt: str) -> tuple[list[int], list[tuple[int, str]]]:
    """The in-driver rule, literally: wiki ids by (len, id), other formats by (task, seq); the first
    occurrence of an id in that order is kept."""
    n = len(meta_rows)
    if fmt == "wikixml":
        order = sorted(range(n), key=lambda i: (len(meta_rows[i]["doc_id"]), meta_rows[i]["doc_id"]))
    else:
        order = sorted(range(n), key=lambda i: (meta_rows[i]["task"], meta_rows[i]["seq"]))
    seen, kept, dups = set(), [], []
    for i in order:
        d = meta_rows[i]["doc_id"]
        if d in seen:
            dups.append((i, d))
        else:
            seen.add(d)
            kept.append(i)
    return kept, dups


def as_tables(rows: list[dict], batch: int) -> list[pa.Table]:
    cols = ("part", "row", "task", "seq", "doc_id", "title", "n_tokens")
    return [pa.table({c: [r[c] for r in rows[i : i + batch]] for c in cols}) for i in range(0, len(rows), batch)]


def random_rows(rng: random.Random, n: int) -> list[dict]:
    alphabet = ["1", "2", "9", "10", "é", "Z", "a", "ß", "日"]
    rows = []
    for i in range(n):
        doc_id = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))  # many repeats
        rows.append({"part": i // 7, "row": i % 7, "task": rng.randint(0, 3), "seq": rng.randint(0, 50),
                     "doc_id": doc_id, "title": f"T{i}", "n_tokens": rng.randint(1, 900)})
    return rows


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("fmt", ["wikixml", "jsonl"])
def test_order_documents_matches_the_python_rule(seed, fmt):
    rng = random.Random(seed)
    rows = random_rows(rng, rng.randint(0, 60))
    for r, (task, seq) in zip(rows, rng.sample([(t, s) for t in range(4) for s in range(60)], len(rows))):
        r["task"], r["seq"] = task, seq  # (task, seq) unique, as the read tasks number them
    meta = DocMeta.concat(as_tables(rows, batch=rng.randint(1, 9)))
    order, dups = order_documents(meta, fmt)
    want_order, want_dups = reference_order(rows, fmt)
    assert order.tolist() == want_order and order.dtype == np.int64
    assert dups == want_dups


def test_doc_meta_concat_keeps_strings_in_arrow_and_passage_counts():
    rows = random_rows(random.Random(3), 20)
    tables = as_tables(rows, batch=6)
    tables = [t.append_column("passage_tokens", pa.array([[1, 2]] * t.num_rows, type=pa.list_(pa.int64())))
              for t in tables]
    meta = DocMeta.concat(tables)
    assert len(meta) == 20 and isinstance(meta.title, pa.ChunkedArray)
    assert meta.doc_id.to_pylist() == [r["doc_id"] for r in rows]
    assert meta.n_tokens.tolist() == [r["n_tokens"] for r in rows] and meta.part.dtype == np.int32
    assert [p.tolist() for p in meta.passage_tokens] == [[1, 2]] * 20
    assert 0 < meta.nbytes < 20 * 200  # tens of bytes per document, not a Python object each
    empty = DocMeta.concat([])
    order, dups = order_documents(empty, "jsonl")
    assert len(empty) == 0 and order.shape == (0,) and dups == []
