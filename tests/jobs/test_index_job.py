"""``python -m jobs.index`` as a user runs it: JSONL with bad lines, refusal to mix builds,
--overwrite, units never split across shards, and a build written to a real S3-compatible server."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from jobs import index as index_job
from longrag.index.artifacts import ArtifactStore, load_shard

pytestmark = pytest.mark.ray("a")  # starts a local Ray (tests/conftest.py)


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


@pytest.fixture(scope="module")
def ray_up():
    """One local Ray for the module's runs, started after a local S3-compatible server (moto) so its
    workers have the endpoint: ``jobs.index`` joins a connected driver's Ray (as under ``ray job
    submit``) and leaves it running. Yields the S3 endpoint (bucket ``builds``)."""
    from cluster.local import start_or_join
    from tests.s3server import moto_s3

    with moto_s3("builds") as endpoint:
        handle = start_or_join(None, num_cpus=4)
        try:
            yield endpoint
        finally:
            handle.shutdown()


def _run(argv):
    return index_job.main([*argv, "--num-cpus", "4", "--set", "units.max_group_tokens=120"])


def test_jsonl_build_counts_bad_lines_and_refuses_to_mix(ray_up, tmp_path, capsys):
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


def test_build_into_s3_compatible_store(ray_up, tmp_path):
    import boto3

    src = tmp_path / "docs.jsonl"
    _corpus(src, n=12)
    # the source is an S3 object too, as in the README / cluster/aws.yaml / the RayJob (issue 9)
    boto3.client("s3", endpoint_url=ray_up).upload_file(str(src), "builds", "sources/docs.jsonl")
    uri = "s3://builds/test/jsonl"
    assert _run(["--source", "s3://builds/sources/docs.jsonl", "--format", "jsonl", "--out", uri,
                 "--shards", "2"]) == 0
    store = ArtifactStore.open(uri)
    manifest = store.read_manifest()
    assert manifest.status == "complete" and manifest.counts.documents == 12
    for entry in manifest.shards:
        index, units = load_shard(store, entry.shard_id)  # verifies sha256 of every file
        assert index.ntotal == entry.n_chunks and len(units) == entry.n_units


def _interrupt(store: ArtifactStore, lost: int) -> None:
    """Put a complete build back into the state a crash leaves: manifest ``building`` without shard
    entries, and shard ``lost`` half written (files there, no ``shard.json`` marker)."""
    manifest = store.read_manifest()
    manifest.status = "building"
    manifest.shards = []
    store.write_manifest(manifest)
    store.storage.delete(store.shard_key(lost, "shard.json"))


def test_resume_keeps_verified_shards_and_rebuilds_the_rest(ray_up, tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    _corpus(src)
    out = tmp_path / "build"
    argv = ["--source", str(src), "--format", "jsonl", "--out", str(out), "--unit", "grouped", "--shards", "3"]
    assert _run(argv) == 0
    store = ArtifactStore.open(str(out))
    original = store.read_manifest()
    assert sorted(original.plan) == ["0", "1", "2"]
    shard_dir = {s: out / "shards" / f"shard-{s:05d}" for s in range(3)}
    units_before = {s: (shard_dir[s] / "units.parquet").read_bytes() for s in range(3)}

    # --resume on a complete build, or on nothing, is refused before anything starts.
    assert _run([*argv, "--resume"]) == 1
    assert "already complete" in capsys.readouterr().err
    assert _run([*argv[:-4], "--out", str(tmp_path / "none"), "--resume"]) == 1
    assert "no build to resume" in capsys.readouterr().err

    # Crash state: shard 1 never got its marker; shard 2's chunk file was damaged after it was written.
    _interrupt(store, lost=1)
    (shard_dir[2] / "chunks.parquet").write_bytes(b"torn write")
    kept_mtime = (shard_dir[0] / "index.faiss").stat().st_mtime_ns
    # A plain rerun says how to finish it.
    assert _run(argv) == 1
    assert "--resume" in capsys.readouterr().err
    # A resume with another config is refused and changes nothing.
    assert _run([*argv, "--resume", "--max-group-tokens", "200"]) == 1
    assert "build settings differ" in capsys.readouterr().err and store.status() == "building"

    # Resources may change between the crash and the resume (here the embedding batch size).
    assert _run([*argv, "--resume", "--set", "embedding.batch_size=16"]) == 0
    report = json.loads((out / "build_report.json").read_text())
    assert report["resume"]["kept_shards"] == [0] and report["resume"]["built_shards"] == [1, 2]
    assert report["resume"]["why_built"]["1"] == "not written"
    assert "verification" in report["resume"]["why_built"]["2"]
    manifest = store.read_manifest()
    assert manifest.status == "complete" and manifest.build_id == original.build_id
    assert [s.model_dump() for s in manifest.shards][0] == original.shards[0].model_dump()
    assert manifest.counts == original.counts and manifest.plan == original.plan
    assert (shard_dir[0] / "index.faiss").stat().st_mtime_ns == kept_mtime  # not rewritten
    for s in range(3):
        assert (shard_dir[s] / "units.parquet").read_bytes() == units_before[s]
        index, units = load_shard(store, s)  # every file verifies again
        assert index.ntotal == manifest.shard(s).n_chunks == original.shard(s).n_chunks


def test_bge_large_tokenizer_is_found_for_grouping_and_chunking(tmp_path, monkeypatch):
    """Issue 9: the documented production embedder (``--set embedding.model=bge-large-en-v1.5``)
    failed in ``counter_for_model_dir`` with "no tokenizer": the job passed the hub name as a
    folder. Grouping (driver) and chunking (Ray Data worker) now count with the tokenizer in the
    model's hub cache snapshot (a stand-in cache here: bge-large is not installed)."""
    from actors.build import ChunkUnits
    from longrag.config import load_config
    from longrag.index.plan import group_documents
    from longrag.types import Document
    from tests.hub_cache import fake_hub_cache

    fake_hub_cache(tmp_path / "hub", "BAAI/bge-large-en-v1.5", monkeypatch)
    config = load_config(None, ["embedding.model=bge-large-en-v1.5", "units.max_group_tokens=40"])
    docs = [Document(f"d{i}", f"Topic {i}", f"Topic {i} is a subject about item {i}.", [f"Topic {i + 1}"])
            for i in range(6)]
    units = group_documents(docs, config)
    assert sum(len(u.doc_ids) for u in units) == 6 and all(0 < u.n_tokens <= 40 for u in units)
    chunker = ChunkUnits("bge-large-en-v1.5", 8)
    batch = {"unit_id": [u.unit_id for u in units], "titles": [u.titles for u in units],
             "text": [u.text for u in units], "shard": [0] * len(units)}
    out = chunker(batch)
    assert out["chunk_id"] and max(out["n_tokens"]) <= 8
