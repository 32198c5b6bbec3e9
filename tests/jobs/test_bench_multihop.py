"""``jobs.bench multihop`` on the first questions of the MuSiQue sample: every signal scored, and the
invariants that hold whatever the model: evidence order changes no unit ranking (same R/AR/PR@k), a
second hop keeps the first hop's top unit first (same @1),
recall grows with k and with the token budget (the unit graph and its walk: tests/longrag/test_unit_graph.py)."""

from __future__ import annotations

import json

from lab.bench.cli import multihop as B


def test_all_signals_on_a_small_pool(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LONGRAG_MODEL_CACHE", str(tmp_path / "models"))  # the vector cache's, not the user's
    out = tmp_path / "bench"
    assert B.main(["--limit", "6", "--k", "1,2,4", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["signal"].split(" (")[0].split(",")[0]: r for r in summary["results"]}
    assert len(summary["results"]) == 11 and summary["questions"] == 6
    signals, contexts = summary["results"][:8], summary["results"][8:]
    dense, evidence = signals[0], signals[1]
    for key in ("R@1", "R@2", "R@4", "AR@2", "PR@2", "PR@4"):
        assert dense[key] == evidence[key]
    for r in signals:
        assert r["R@1"] <= r["R@2"] <= r["R@4"] and r["PR@1"] <= r["PR@2"] <= r["PR@4"]
        assert r["PR<260"] <= r["PR<650"] <= r["PR<1024"]
    # the reader's context of the top 2 (stored, evidence, packed): never more than the top 2 hold, and more
    # with more budget
    assert [r["signal"].split(": ")[-1] for r in contexts] == ["stored", "evidence", "packed"]
    for r in contexts:
        assert r["PR@2"] == dense["PR@2"]
        assert r["RC<512"] <= r["RC<1024"] <= r["RC<2048"] <= r["PR@2"]
    # a second hop (gold bridge, the embedder's sentence, Rocchio) keeps the first hop's top unit first
    for r in signals[-3:]:
        assert r["signal"].startswith("second hop") and (r["R@1"], r["AR@1"], r["PR@1"]) == \
            (dense["R@1"], dense["AR@1"], dense["PR@1"])
    assert "BM25" in rows and "| signal |" in (out / "table.md").read_text()
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("{")



def test_a_rerun_takes_the_chunk_vectors_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGRAG_MODEL_CACHE", str(tmp_path / "models"))  # the vector cache's default place
    runs = []
    for name in ("first", "second"):
        assert B.main(["--limit", "3", "--k", "1,2", "--signals", "dense", "--out", str(tmp_path / name)]) == 0
        runs.append(json.loads((tmp_path / name / "summary.json").read_text()))
    assert runs[0]["chunks_from_vector_cache"] == 0
    assert runs[1]["chunks_from_vector_cache"] == runs[1]["chunks"] > 0
    assert runs[1]["results"] == runs[0]["results"]
    assert list((tmp_path / "models" / "vectors").glob("*.sqlite"))
    assert B.main(["--limit", "3", "--k", "1", "--signals", "dense", "--no-vector-cache",
                   "--out", str(tmp_path / "off")]) == 0
    assert json.loads((tmp_path / "off" / "summary.json").read_text())["chunks_from_vector_cache"] == 0
