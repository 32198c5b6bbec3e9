"""``python -m jobs.longcontext --strategy``: dual-perspective LongRAG over one document in a subprocess
(real bundled encoder and Qwen reader), its 'dense only' trace, and option errors."""

from __future__ import annotations

import json

from tests.jobs.test_longcontext_cli import cli
from tests.longrag.test_dual_real import DOCUMENT, QUESTION

SMALL = ["--set", "dual.chunk_words=24", "--set", "llm.context_window=2048", "--set", "dual.extractor_max_tokens=32",
         "--set", "dual.cot_max_tokens=32", "--set", "dual.judge_max_tokens=12", "--set", "dual.generator_max_tokens=12"]  # fmt: skip


def test_strategy_retrieve_only_and_ef_answer(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOCUMENT, encoding="utf-8")
    p = cli("--document", str(doc), "--question", QUESTION, "--strategy", "R&B", "--k", "2", "--retrieve-only",
            "--json", *SMALL)  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["strategy"] == "R&B" and "answer" not in out and len(out["chunks"]) == 2
    assert out["trace"]["retrieval"]["mode"] == "dense only" and out["trace"]["n_paragraphs"] == 5
    assert all(set(c) == {"position", "paragraph_id", "text", "score"} for c in out["chunks"])

    p = cli("--document", str(doc), "--question", QUESTION, "--strategy", "E&F", "--k", "2", "--json", *SMALL,
            "--torch-threads", "1")  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["answer"] and out["global_information"] and out["cot"] and len(out["judgements"]) == 2
    stages = out["trace"]["stages"]
    assert [s["stage"] for s in stages] == ["extractor", "filter", "generator"]
    assert all(s["prompt_tokens"] > 0 and s["completion_tokens"] > 0 and s["wall_ms"] > 0 for s in stages)
    assert out["trace"]["generator_input_tokens"] == stages[-1]["prompt_tokens"]
    assert set(out["kept_chunk_ids"]) <= {c["position"] for c in out["chunks"]}


def test_strategy_option_errors(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOCUMENT, encoding="utf-8")
    p = cli("--document", str(doc), "--question", "q?", "--strategy", "E&F", "--route", "local", "--json")
    assert p.returncode == 2 and "--strategy runs the dual pipeline" in p.stderr and "Traceback" not in p.stderr
    p = cli("--document", str(doc), "--question", "q?", "--strategy", "RAG", "--json")
    assert p.returncode == 2 and "invalid choice: 'RAG'" in p.stderr
    p = cli("--document", str(doc), "--question", "q?", "--strategy", "Fil", "--retrieve-only", "--json",
            "--set", f"dual.reranker={tmp_path / 'none'}")  # fmt: skip
    assert p.returncode == 2 and "dual.reranker=null" in p.stderr and "Traceback" not in p.stderr
