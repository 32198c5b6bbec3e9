"""``python -m jobs.index`` as a user runs it: JSONL with bad lines, refusal to mix builds,
--overwrite, units never split across shards, and a build written to a real S3-compatible server."""

from __future__ import annotations

import json
import socket

import pyarrow.parquet as pq
import pytest

from jobs import index as index_job
from longrag.store import ArtifactStore, load_shard


def _corpus(path, n=24):
    """Small linked corpus: chains of related documents plus one malformed and one textless line."""
    lines = []
    for i in range(n):
        links = [f"Topic {i + 1}"] if i % 4 != 3 else []
        text = " ".join([f"Topic {i} is a subject about item number {i}."] * (3 + i % 5))
        lines.append(json.dumps({"id": f"doc{i}", "title": f"Topic {i}", "text": text, "links": links}))
    lines.insert(5, "{this is not json")
    lines.insert(9, json.dumps({"id": "empty", "title": "Empty", "text": ""}))
    path.write_text("\n".join(lines) + "\n")
    return n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv):
    return index_job.main([*argv, "--num-cpus", "4", "--set", "units.max_group_tokens=120"])


def test_jsonl_build_counts_bad_lines_and_refuses_to_mix(tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    n = _corpus(src)
    out = tmp_path / "build"
    argv = ["--source", str(src), "--format", "jsonl", "--out", str(out), "--unit", "grouped", "--shards", "3"]
    assert _run(argv) == 0
    report = json.loads((out / "build_report.json").read_text())
    assert report["read"]["n_ok"] == n and report["read"]["n_bad"] == 2
    assert {b["line"] for b in report["read"]["bad"]} == {6, 10}

    store = ArtifactStore.open(str(out))
    manifest = store.read_manifest()
    assert manifest.status == "complete" and len(manifest.shards) == 3
    assert manifest.counts.documents == n
    assert manifest.embedding.model == "all-MiniLM-L6-v2" and manifest.embedding.dim == 384
    assert manifest.provenance.command[:3] == ["python", "-m", "jobs.index"]
    # Grouping put linked documents together, within the budget.
    assert report["grouping"]["n_units"] < n
    # Every unit lives in exactly one shard, with all of its chunks.
    owner: dict[str, int] = {}
    for entry in manifest.shards:
        index, units = load_shard(store, entry.shard_id)
        chunks = pq.read_table(out / "shards" / f"shard-{entry.shard_id:05d}" / "chunks.parquet").to_pylist()
        assert {c["unit_id"] for c in chunks} == set(units.ids())
        for uid in units.ids():
            assert uid not in owner, f"unit {uid} in shards {owner[uid]} and {entry.shard_id}"
            owner[uid] = entry.shard_id
    assert len(owner) == manifest.counts.units

    # A second run into the same --out is refused, and nothing is changed.
    before = (out / "manifest.json").read_text()
    assert _run(argv) == 1
    assert "already holds a build" in capsys.readouterr().err
    assert (out / "manifest.json").read_text() == before
    # --overwrite replaces it with a new build.
    assert _run([*argv, "--overwrite"]) == 0
    assert ArtifactStore.open(str(out)).read_manifest().build_id != manifest.build_id


def test_lead_mode_needs_a_wiki_source(tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    _corpus(src)
    rc = _run(["--source", str(src), "--format", "jsonl", "--out", str(tmp_path / "b"), "--text-mode", "lead"])
    assert rc == 1 and "wikixml" in capsys.readouterr().err


def test_build_into_s3_compatible_store(tmp_path, monkeypatch):
    moto_server = pytest.importorskip("moto.server")
    import boto3

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1", "LONGRAG_S3_ENDPOINT_URL": endpoint}.items():
            monkeypatch.setenv(key, value)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="builds")
        src = tmp_path / "docs.jsonl"
        _corpus(src, n=12)
        uri = "s3://builds/test/jsonl"
        assert _run(["--source", str(src), "--format", "jsonl", "--out", uri, "--shards", "2"]) == 0
        store = ArtifactStore.open(uri)
        manifest = store.read_manifest()
        assert manifest.status == "complete" and manifest.counts.documents == 12
        for entry in manifest.shards:
            index, units = load_shard(store, entry.shard_id)  # verifies sha256 of every file
            assert index.ntotal == entry.n_chunks and len(units) == entry.n_units
    finally:
        server.stop()
