"""The evaluation job on hand-made cases and canned HTTP servers: pipeline glue, endpoint mode,
LongBench scoring, MixPR compression in the local reader. The end-to-end runs on a Ray cluster are
in test_evaluate_e2e.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from longrag.data import HOTPOTQA_SAMPLE, data_path
from longrag.eval import pipeline as P
from longrag.eval.datasets import QAExample
from longrag.eval.report import score_results, summarize

HOTPOT = data_path(HOTPOTQA_SAMPLE)  # the bundled 100 HotpotQA questions, gzipped (data/README.md)


# --------------------------------------------------------------------------------------------- glue


@dataclass
class Hit:
    unit_id: str
    score: float


def _example(qid, answers, gold, type_="bridge"):
    return QAExample(qid=qid, question=f"question {qid}?", answers=answers, gold_titles=gold, supporting=[], type=type_)


ROWS = {
    "u1": {"titles": ["A"], "doc_ids": ["da"], "n_tokens": 10, "text": "A\nParis is big."},
    "u2": {"titles": ["B", "C"], "doc_ids": ["db", "dc"], "n_tokens": 30, "text": "B\nnothing\n\nC\nthe river Seine"},
    "u3": {"titles": ["D"], "doc_ids": ["dd"], "n_tokens": 5, "text": "D\nzzz"},
}


def test_results_and_flat_metrics_on_a_hand_made_case():
    exs = [
        _example("q1", ["Paris"], ["A", "C"]),  # answer at rank 1, gold complete at rank 2
        _example("q2", ["Seine"], ["B"]),  # answer and gold at rank 2 (rank 1 is u3)
        _example("q3", ["yes"], ["A", "D"], "comparison"),  # not counted for answer recall
    ]
    ranked = {"q1": ["u1", "u2", "u3"], "q2": ["u3", "u2", "u1"], "q3": ["u2", "u1", "u3"]}
    results = []
    for ex in exs:
        r = P.base_result(ex, "grouped", reader_k=2)
        r["retrieved"] = P.retrieved_from_hits([Hit(u, 1.0 - i / 10) for i, u in enumerate(ranked[ex.qid])], ROWS)
        results.append(r)
    assert results[0]["retrieved"][1] == {"unit_id": "u2", "score": 0.9, **ROWS["u2"]}
    P.attach_reader(results[0], {"answer": "Paris", "long_answer": "It is Paris.", "units_used": ["u1", "u2"],
                                 "prompt_tokens": 100, "completion_tokens": 7, "context_tokens": 40,
                                 "truncated": False, "stages_ms": {"total": 1500.0}})
    P.attach_reader(results[1], {"answer": "the Seine river", "context_tokens": 30})
    P.attach_reader(results[2], {"answer": "no", "context_tokens": 20})
    scored = score_results(results, ks=[1, 2, 3], answer_recall_types=["bridge"])
    flat = P.flat_metrics(scored, summarize(scored), dataset="hotpotqa", unit="grouped", reader_k=2)
    ret = flat["retrieval"]
    # gold recall: q1 {0,1,1}, q2 {0,1,1}, q3: A at rank 2, D at rank 3 -> {0,0,1}
    assert ret["recall@1"] == pytest.approx(0.0)
    assert ret["recall@2"] == pytest.approx(2 / 3)
    assert ret["recall@3"] == pytest.approx(1.0)
    # answer recall over bridge questions only: q1 {1,1,1}, q2 {0,1,1}
    assert ret["answer_recall_n"] == 2
    assert ret["answer_recall@1"] == pytest.approx(0.5)
    assert ret["answer_recall@2"] == pytest.approx(1.0)
    # context tokens: q1 10,40,45; q2 5,35,45; q3 30,40,45
    assert ret["context_tokens@1"] == pytest.approx(15.0)
    assert ret["context_tokens@2"] == pytest.approx(115 / 3)
    qa = flat["qa"]
    assert qa["n"] == 3
    assert qa["em"] == pytest.approx(1 / 3)
    # refined EM: "the Seine river" (3 tokens) contains "Seine" -> counts; "no" vs "yes" does not
    assert qa["refined_em"] == pytest.approx(2 / 3)
    assert flat["avg_context_tokens"] == pytest.approx(30.0) and flat["avg_context_tokens_source"] == "reader"
    assert flat["avg_top1_unit_tokens"] == pytest.approx(15.0)
    assert flat["reader_s"] == pytest.approx(1.5)
    assert scored[0]["reader_units_used"] == 2
    table = P.paper_table([{**flat, "label": "grouped", "corpus_units": 3, "corpus_avg_unit_tokens": 15}])
    assert table.count("\n") == 1 + 3 and "| grouped | 3 | 15 / 15 | 1 | 0.0 | 50.0 | 15 |" in table
    assert "| grouped | 2 | 3 | 33.3 | 66.7 |" in P.qa_table([{**flat, "label": "grouped"}])
    with pytest.raises(ValueError, match="no unit row"):
        P.retrieved_from_hits([Hit("u9", 0.1)], ROWS)


def test_flat_metrics_without_reader_uses_retrieved_tokens_at_reader_k():
    r = P.base_result(_example("q1", ["Paris"], ["A"]), "document")
    r["retrieved"] = P.retrieved_from_hits([Hit("u1", 0.5), Hit("u2", 0.4)], ROWS)
    scored = score_results([r], ks=[1, 2])
    flat = P.flat_metrics(scored, summarize(scored), dataset="x", unit="document", reader_k=2)
    assert flat["qa"] == {"em": None, "refined_em": None, "f1": None, "n": 0}
    assert flat["avg_context_tokens"] == 40 and flat["avg_context_tokens_source"] == "retrieved@2"


def test_endpoint_units_and_json_roundtrip():
    units = [
        {"unit_id": "g1", "titles": ["A", "B"], "doc_ids": ["da", "db"], "score": 0.7, "n_tokens": 12, "shard": 0},
        {"unit_id": "g2", "titles": ["C"], "doc_ids": ["dz"], "score": 0.5, "n_tokens": 4},
    ]
    out = P.retrieved_from_endpoint(units, {"da": "A\ntext a", "db": "B\ntext b"})
    assert out[0]["text"] == "A\ntext a\n\nB\ntext b"
    assert "text" not in out[1]  # unknown doc id: no text, so no answer recall for that question
    assert [u["unit_id"] for u in P.retrieved_from_endpoint(units)] == ["g1", "g2"]
    with pytest.raises(ValueError, match="n_tokens"):
        P.retrieved_from_endpoint([{"unit_id": "x", "titles": [], "score": 1.0}])
    row = json.loads(json.dumps({"qid": "q", "gold_recall": {1: 0.0, 16: 1.0}, "answer_recall": {2: 1.0}}))
    assert P.curves_from_json(row)["gold_recall"] == {1: 0.0, 16: 1.0}


def _read(run: Path) -> tuple[dict, list[dict]]:
    metrics = json.loads((run / "metrics.json").read_text())
    preds = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    return metrics, preds


# --------------------------------------------------------------------------------------------- endpoint


def test_endpoint_mode_against_a_canned_http_server(tmp_path):
    """``--endpoint``: questions go over HTTP; the job scores what the server returns (the server
    here is a stand-in with fixed answers: the job's client side is what is tested)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from jobs.evaluate import main
    from longrag.eval.corpus import title_doc_id
    from longrag.eval.datasets import load_qa

    exs = {ex.question: ex for ex in load_qa(HOTPOT, "hotpotqa", limit=2).examples}
    seen: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output quiet
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            ex = exs[body["question"]]
            gold = ex.gold_titles
            if self.path == "/v1/retrieve":
                # rank 1: a distractor; rank 2: both gold documents as one grouped unit
                other = next(p.title for p in ex.paragraphs if p.title not in gold)
                units = [
                    {"unit_id": "u-x", "titles": [other], "doc_ids": [title_doc_id(other)], "score": 0.9,
                     "n_tokens": 50, "shard": 0, "best_chunk_id": "c"},
                    {"unit_id": "u-g", "titles": gold, "doc_ids": [title_doc_id(t) for t in gold], "score": 0.8,
                     "n_tokens": 120, "shard": 1, "best_chunk_id": "c"},
                ][: body["k"]]
                out = {"question": body["question"], "k": body["k"], "units": units,
                       "coverage": {"shards": 2, "answered": 2, "degraded": False}, "trace": {}}
            else:
                out = {"question": body["question"], "answer": ex.answers[0], "long_answer": "because",
                       "evidence": [{"unit_id": "u-x", "titles": [], "score": 0.9, "used": True}],
                       "coverage": {"shards": 2, "answered": 2, "degraded": False},
                       "trace": {"prompt_tokens": 300, "completion_tokens": 9, "read_ms": 250.0}}
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out = tmp_path / "ep"
        argv = ["--dataset", "hotpotqa", "--data", str(HOTPOT), "--limit", "2", "--k", "1,2", "--pipeline", "longrag",
                "--reader-k", "2", "--endpoint", f"http://127.0.0.1:{server.server_address[1]}", "--out", str(out),
                "--no-progress", "--answer-recall-all-types"]
        assert main(argv) == 0
    finally:
        server.shutdown()
    assert [p for p, _ in seen] == ["/v1/retrieve"] * 2 + ["/v1/answer"] * 2
    assert all(b["k"] == 2 for _, b in seen)
    metrics, preds = _read(out)
    assert metrics["retrieval"]["recall@1"] == 0.0 and metrics["retrieval"]["recall@2"] == 1.0
    assert metrics["retrieval"]["context_tokens@2"] == 170
    assert metrics["qa"]["em"] == 1.0 and metrics["qa"]["n"] == 2
    # unit texts rebuilt from the local corpus: the gold unit holds the answer for bridge questions
    for p in preds:
        assert p["answer_recall"]["2"] >= p["answer_recall"]["1"]
        assert p["units_used"] == ["u-x"] and p["prompt_tokens"] == 300
    assert "index" not in metrics["run"]


# --------------------------------------------------------------------------------------------- issue 9


def _canned_server(handle):
    """A local HTTP server whose POST handler is ``handle(path, body) -> response dict``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            data = json.dumps(handle(self.path, body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_longbench_runs_are_scored_with_longbench_f1(tmp_path):
    """Issue 9: a LongBench run was scored with HotpotQA's F1 rule (a yes/no gold against a longer
    prediction scores 0 there); LongBench's own QA F1 is plain token F1: "no, the film was not
    released" against "no" is 2 * (1/5 * 1) / (1/5 + 1) = 1/3."""
    from jobs.evaluate import main

    data = tmp_path / "longbench.jsonl"
    records = [
        {"_id": "a", "input": "Was the film released?", "context": "The film was shelved in 1990. " * 20,
         "answers": ["no"], "dataset": "hotpotqa", "length": 120, "language": "en"},
        {"_id": "b", "input": "Who directed it?", "context": "Jane Roe directed the film. " * 20,
         "answers": ["Jane Roe"], "dataset": "hotpotqa", "length": 100, "language": "en"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    replies = {"Was the film released?": "no, the film was not released", "Who directed it?": "Jane Roe"}

    def handle(path, body):
        unit = {"unit_id": "u0", "titles": ["context"], "doc_ids": ["lb0"], "score": 1.0, "n_tokens": 100}
        if path == "/v1/retrieve":
            return {"units": [unit], "coverage": {"degraded": False}, "trace": {}}
        return {"answer": replies[body["question"]], "long_answer": "", "evidence": [], "trace": {}}

    server = _canned_server(handle)
    try:
        out = tmp_path / "lb"
        argv = ["--dataset", "longbench", "--data", str(data), "--k", "1", "--pipeline", "longrag", "--reader-k", "1",
                "--endpoint", f"http://127.0.0.1:{server.server_address[1]}", "--out", str(out), "--no-progress"]
        assert main(argv) == 0
    finally:
        server.shutdown()
    metrics, preds = _read(out)
    f1 = {p["qid"]: p["f1"] for p in preds}
    assert f1 == {"a": pytest.approx(1 / 3), "b": 1.0}
    assert metrics["qa"]["f1"] == pytest.approx((1 / 3 + 1.0) / 2)
    assert metrics["qa_f1_rule"] == "longbench_qa_f1"


def test_local_reader_compresses_overflowing_units_with_mixpr(monkeypatch):
    """Issue 9: ``jobs.evaluate`` built its LongReader without a compressor, so
    ``reader.compression=mixpr`` raised as soon as the retrieved units overflowed the window. Now the
    units are squeezed by MixPR: the answer sentence from the third unit (which truncation drops)
    reaches the model, and the prompt fits the window."""
    import longrag.llm.factory as factory
    from longrag.config import load_config
    from longrag.eval.run import run_reader_local
    from tests.fakes import ScriptedLLM

    topics = ["rivers", "mountains", "harbours"]
    units = []
    for u, topic in enumerate(topics):
        sents = [f"Survey note {i} of region {u} records weather and {topic} near village {i}." for i in range(60)]
        if u == 2:
            sents.insert(30, "The secret launch code of Project Falcon is 7342.")
        text = " ".join(sents)
        units.append({"unit_id": f"u{u}", "doc_ids": [f"d{u}"], "titles": [f"Region {u}"], "text": text,
                      "n_tokens": len(text.split())})
    question = "What is the secret launch code of Project Falcon?"

    def run(compression: str):
        llm = ScriptedLLM(["7342", "The code is 7342."], context_window=1800)  # the short answer first
        monkeypatch.setattr(factory, "build_llm", lambda cfg: llm)
        config = load_config(None, [f"reader.compression={compression}"])
        results = [{"qid": "q", "question": question, "answers": ["7342"], "retrieved": [dict(u) for u in units]}]
        run_reader_local(results, config, reader_k=3, concurrency=1, progress=False)
        prompt = "\n".join(m["content"] for m in llm.calls[0]["messages"])
        return results[0], prompt, llm

    truncated, prompt, _ = run("truncate")
    assert truncated["reader_truncated"] and "Project Falcon is 7342" not in prompt
    compressed, prompt, llm = run("mixpr")
    assert compressed["reader_compressed"] is True and compressed["prediction"] == "7342"
    assert "The secret launch code of Project Falcon is 7342." in prompt
    assert llm.calls[0]["max_tokens"] + llm.count_message_tokens(llm.calls[0]["messages"]) <= llm.context_window
