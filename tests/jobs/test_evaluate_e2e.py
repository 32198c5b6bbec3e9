"""The evaluation job end to end: small runs on real HotpotQA questions with the bundled embedding
model and LLM (one Ray cluster for the module)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from longrag.eval.plan import file_digest
from tests.jobs.test_evaluate import HOTPOT, _read

pytestmark = pytest.mark.ray("a")  # starts a local Ray (tests/conftest.py)

# --------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def cluster():
    import ray
    import torch

    from cluster.local import WORKER_ENV

    torch.set_num_threads(1)
    # address="local": a fresh Ray of our own even when other Ray instances run on this machine
    # (ray.init() without an address may join the most recent one); the job then joins this one.
    ray.init(address="local", num_cpus=4, include_dashboard=False, object_store_memory=512 * 1024**2,
             namespace="longrag", runtime_env={"env_vars": dict(WORKER_ENV)})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("evaluate")


def _common(workdir: Path, limit: int) -> list[str]:
    # the corpus pools the first 4 questions' paragraphs in every run, so the index is shared
    return [
        "--dataset", "hotpotqa", "--data", str(HOTPOT), "--limit", str(limit), "--pool", "4",
        "--k", "1,2,4", "--index-dir", str(workdir / "index"), "--no-progress",
        "--set", f"embedding.vector_cache_dir={workdir / 'vectors'}",
    ]


def _check_retrieval(metrics: dict, preds: list[dict], n: int) -> None:
    assert metrics["dataset"] == "hotpotqa" and metrics["n"] == n
    for key in ("retrieval", "qa", "avg_context_tokens", "config", "provenance"):
        assert key in metrics
    ret = metrics["retrieval"]
    recall = [ret[f"recall@{k}"] for k in (1, 2, 4)]
    assert all(0.0 <= v <= 1.0 for v in recall) and recall == sorted(recall)
    assert all(0.0 <= ret[f"answer_recall@{k}"] <= 1.0 for k in (1, 2, 4))
    assert metrics["provenance"]["data"]["sha256"] == file_digest(HOTPOT)["sha256"]
    assert len(preds) == n
    for p in preds:
        assert len(p["retrieved"]) == 4 and all("text" not in u for u in p["retrieved"])
        # gold recall recomputed from the written titles: all gold titles within the first k units
        for k in (1, 2, 4):
            seen = {t for u in p["retrieved"][:k] for t in u["titles"]}
            assert p["gold_recall"][str(k)] == float(set(p["gold_titles"]) <= seen)
    assert recall[0] == pytest.approx(sum(p["gold_recall"]["1"] for p in preds) / n)


def test_retrieval_run_compares_unit_kinds(cluster, workdir):
    from jobs.evaluate import main

    out = workdir / "retrieve"
    argv = _common(workdir, 4) + ["--unit", "grouped,document", "--links", "titles", "--pipeline", "retrieve",
                                  "--encode", "ray-data", "--out", str(out)]
    assert main(argv) == 0
    for kind in ("grouped", "document"):
        metrics, preds = _read(out / kind)
        _check_retrieval(metrics, preds, 4)
        assert metrics["unit"] == kind and metrics["run"]["retrieval"]["encode_mode"] == "ray-data"
        assert metrics["run"]["index"]["reused"] is False
        assert metrics["qa"]["n"] == 0
        assert (out / kind / "report.md").is_file() and (out / kind / "recall_vs_units.png").is_file()
    grouped, _ = _read(out / "grouped")
    document, dpreds = _read(out / "document")
    # the pooled corpus of 4 questions holds 40 paragraphs; a document unit is one of them
    assert document["corpus_units"] == document["corpus_documents"] == 40
    assert grouped["corpus_units"] < 40
    assert all(len(u["titles"]) == 1 for p in dpreds for u in p["retrieved"])
    # the builds' embedding actors wrote their chunk vectors to the evaluation's vector cache (on by default)
    import sqlite3

    (cache,) = (workdir / "vectors").glob("*.sqlite")
    with sqlite3.connect(cache) as con:
        assert con.execute("SELECT count(*) FROM vectors").fetchone()[0] >= 40  # every document, and the groups
    combined = json.loads((out / "metrics.json").read_text())
    assert [r["unit"] for r in combined["runs"]] == ["grouped", "document"]
    assert set(combined["summary"]["retrieval"]) == {"grouped", "document"}
    report = (out / "report.md").read_text()
    assert "Paper-style table" in report and "| document | 40 |" in report
    for png in ("recall_vs_units.png", "recall_vs_tokens.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reader_run_reuses_the_index(cluster, workdir, caplog):
    from jobs.evaluate import main

    out = workdir / "longrag"
    argv = _common(workdir, 2) + [
        "--unit", "grouped", "--links", "titles", "--pipeline", "longrag", "--reader-k", "1",
        "--encode", "driver", "--out", str(out),
        "--set", "reader.few_shot_examples=2", "--set", "llm.context_window=2048",
    ]
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
    assert any("reusing index" in rec.getMessage() for rec in caplog.records)
    metrics, preds = _read(out)
    assert metrics["run"]["index"]["reused"] is True
    assert json.loads((out / "run_summary.json").read_text())["index_reused"] == [True]
    _check_retrieval(metrics, preds, 2)
    # driver encoding ranks exactly as the Ray Data encoder did in the first run
    _, first = _read(workdir / "retrieve" / "grouped")
    assert [[u["unit_id"] for u in p["retrieved"]] for p in preds] == [
        [u["unit_id"] for u in p["retrieved"]] for p in first[:2]
    ]
    qa = metrics["qa"]
    assert qa["n"] == 2
    for key in ("em", "refined_em", "f1"):
        assert 0.0 <= qa[key] <= 1.0
    for p in preds:
        assert isinstance(p["prediction"], str) and p["prediction"].strip()
        assert p["reader_units_used"] == 1 and p["units_used"] == [p["retrieved"][0]["unit_id"]]
        assert 0 < p["reader_context_tokens"] <= 2048 and p["prompt_tokens"] > p["reader_context_tokens"]
    assert metrics["avg_context_tokens"] == pytest.approx(sum(p["reader_context_tokens"] for p in preds) / 2)
    assert "Answer quality" in (out / "report.md").read_text()
    # the gold paragraphs the reader was given: recomputed from the context it kept
    for p in preds:
        squash = " ".join(p["reader_context"].split())
        share = sum(" ".join(g.split()) in squash for g in p["gold_paragraphs"]) / len(p["gold_paragraphs"])
        assert p["reader_paragraph_recall"] == share
    assert metrics["reader_paragraph_recall"] == pytest.approx(sum(p["reader_paragraph_recall"] for p in preds) / 2)


def test_iterative_retrieval_runs_a_second_hop_with_the_bundled_llm(cluster, workdir):
    """retrieval.mode=iterative over the local shards: one bridge call per question (the bundled 0.5B),
    the hop statistics in the run's info, every list k long and scored like a dense run."""
    from jobs.evaluate import main

    out = workdir / "iterative"
    argv = _common(workdir, 2) + ["--unit", "grouped", "--links", "titles", "--pipeline", "retrieve",
                                  "--out", str(out), "--set", "retrieval.mode=iterative"]
    assert main(argv) == 0
    metrics, preds = _read(out)
    _check_retrieval(metrics, preds, 2)
    stats = metrics["run"]["retrieval"]
    assert stats["mode"] == "iterative" and stats["max_hops"] == 2 and stats["llm_s"] > 0
    assert sum(stats["hops_per_question"].values()) == 2 and len(stats["bridges"]) == 2
    assert all(0.0 <= p["paragraph_recall"]["2"] <= 1.0 for p in preds)


def test_reader_answers_checkpointed_by_a_dead_run_are_reused(cluster, workdir, caplog):
    """A run that died after reading one of two questions left that answer in its checkpoint; the
    rerun reads only the other question, writes both, and removes the checkpoint."""
    from jobs.evaluate import main
    from longrag.config import load_config
    from longrag.eval.checkpoint import ReaderCheckpoint
    from longrag.eval.plan import checkpoint_file, reader_setup

    overrides = ["reader.few_shot_examples=2", "llm.context_window=2048"]
    _, first = _read(workdir / "longrag")  # the reader run above (k=1, the same settings)
    out = workdir / "longrag-resumed"
    ck = ReaderCheckpoint(checkpoint_file(out, "grouped"), reader_setup(load_config(None, overrides), 1))
    done = first[0]
    ck.add(done["qid"], done["question"], [u["unit_id"] for u in done["retrieved"][:1]],
           {"answer": "FROM THE CHECKPOINT", "long_answer": "", "prompt_tokens": 1, "completion_tokens": 1,
            "context_tokens": 1, "units_used": [done["retrieved"][0]["unit_id"]], "stages_ms": {"total": 1.0}})
    argv = _common(workdir, 2) + [
        "--unit", "grouped", "--links", "titles", "--pipeline", "longrag", "--reader-k", "1",
        "--encode", "driver", "--out", str(out), *[x for o in overrides for x in ("--set", o)],
    ]
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
    assert any("1 of 2 answers reused, 1 to read" in rec.getMessage() for rec in caplog.records)
    metrics, preds = _read(out)
    by_qid = {p["qid"]: p for p in preds}
    assert by_qid[done["qid"]]["prediction"] == "FROM THE CHECKPOINT"
    other = next(p for p in preds if p["qid"] != done["qid"])
    assert other["prediction"].strip() and other["prediction"] != "FROM THE CHECKPOINT"  # read by the model
    assert metrics["run"]["reader"]["from_checkpoint"] == 1
    assert not checkpoint_file(out, "grouped").exists()


def test_interrupted_index_is_resumed_not_rebuilt(cluster, workdir, caplog):
    """A crash during an evaluate run's index build leaves the build ``building``; the rerun
    finishes it, keeping the shards that were written, and ranks exactly as before."""
    from jobs.evaluate import main
    from longrag.index.artifacts import ArtifactStore

    first, first_preds = _read(workdir / "retrieve" / "document")
    store = ArtifactStore.open(first["run"]["index"]["uri"])
    manifest = store.read_manifest()
    assert len(manifest.shards) >= 2
    manifest.status, manifest.shards = "building", []
    store.write_manifest(manifest)
    store.storage.delete(store.shard_key(1, "shard.json"))  # shard 1 was being written

    out = workdir / "resumed"
    argv = _common(workdir, 4) + ["--unit", "document", "--pipeline", "retrieve", "--encode", "driver",
                                  "--out", str(out)]
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
    assert any("resumed the unfinished build" in rec.getMessage() for rec in caplog.records)
    metrics, preds = _read(out)
    resume = metrics["run"]["index"]["build_report"]["resume"]
    assert resume["built_shards"] == [1] and 0 in resume["kept_shards"]
    assert store.read_manifest().status == "complete" and store.read_manifest().build_id == manifest.build_id
    assert [[u["unit_id"] for u in p["retrieved"]] for p in preds] == [
        [u["unit_id"] for u in p["retrieved"]] for p in first_preds
    ]
    assert metrics["retrieval"] == first["retrieval"]
