"""Dataset downloads against a real local HTTP server: success, checksum mismatch, 404, resume after
a cut connection, a server without range support, an already present file, zip extraction."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from urllib.parse import urlparse

import pytest

from longrag.corpus.fetch import DATASETS, ChecksumError, FetchError, RemoteDataset, fetch, get_dataset
from tests.http_server import PAYLOAD, SHA, FileServer


@pytest.fixture
def server():
    with FileServer() as s:
        s.files["/data/file.json"] = PAYLOAD
        yield s


def _spec(server: FileServer, path: str = "/data/file.json", **kw) -> RemoteDataset:
    return RemoteDataset("test-set", server.url(path), Path(path).name, "a test file", "CC0", "http://x", **kw)


def test_download_verifies_sha256_and_leaves_no_part_file(server, tmp_path):
    res = fetch(_spec(server), tmp_path, sha256=SHA)
    assert res.path == tmp_path / "file.json" and res.path.read_bytes() == PAYLOAD
    assert res.sha256 == SHA and res.verified and not res.skipped and res.resumed_from == 0
    assert res.n_bytes == len(PAYLOAD) and sorted(p.name for p in tmp_path.iterdir()) == ["file.json"]
    assert "sha256 verified" in res.summary()
    # without an expected digest the download is kept and its digest reported for pinning
    res2 = fetch(_spec(server), tmp_path / "b")
    assert res2.sha256 == SHA and not res2.verified and "not pinned" in res2.summary()


def test_checksum_mismatch_removes_the_download(server, tmp_path):
    with pytest.raises(ChecksumError, match=f"sha256 {SHA} does not match the expected 0{{64}}"):
        fetch(_spec(server), tmp_path, sha256="0" * 64)
    assert list(tmp_path.iterdir()) == []
    # a pinned digest in the registry entry is checked the same way
    with pytest.raises(ChecksumError):
        fetch(_spec(server, sha256="f" * 64), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_http_404_is_a_clear_error(server, tmp_path):
    spec = _spec(server, "/data/missing.json")
    with pytest.raises(FetchError, match=r"missing\.json: HTTP 404 Not Found"):
        fetch(spec, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_connection_refused_names_the_url(tmp_path):
    spec = RemoteDataset("x", "http://127.0.0.1:9/none.json", "none.json", "d", "l", "h")
    with pytest.raises(FetchError, match=r"http://127\.0\.0\.1:9/none\.json: ConnectError"):
        fetch(spec, tmp_path, timeout=5)


def test_cut_download_resumes_with_a_range_request(server, tmp_path):
    server.cut_after = 300_000
    with pytest.raises(FetchError, match="run the same command again to resume"):
        fetch(_spec(server), tmp_path, sha256=SHA, chunk_size=4096)
    part = tmp_path / "file.json.part"
    kept = part.stat().st_size  # what arrived, less the last incomplete block
    assert 0 < kept <= 300_000 and not (tmp_path / "file.json").exists()
    res = fetch(_spec(server), tmp_path, sha256=SHA)
    assert server.requests[-1][1] == f"bytes={kept}-"
    assert res.resumed_from == kept and res.path.read_bytes() == PAYLOAD and not part.exists()


def test_server_without_ranges_restarts_from_zero(server, tmp_path):
    (tmp_path / "file.json.part").write_bytes(b"stale bytes that are not the file")
    server.ranges = False
    res = fetch(_spec(server), tmp_path, sha256=SHA)
    assert res.resumed_from == 0 and res.path.read_bytes() == PAYLOAD


def test_complete_part_file_is_finished_without_a_body(server, tmp_path):
    (tmp_path / "file.json.part").write_bytes(PAYLOAD)  # cut after the last byte, before the rename
    res = fetch(_spec(server), tmp_path, sha256=SHA)
    assert res.resumed_from == len(PAYLOAD) and res.path.read_bytes() == PAYLOAD


def test_present_file_is_checked_not_downloaded(server, tmp_path):
    fetch(_spec(server), tmp_path)
    n = len(server.requests)
    res = fetch(_spec(server), tmp_path, sha256=SHA)
    assert res.skipped and res.verified and len(server.requests) == n
    with pytest.raises(ChecksumError, match="already present; delete it"):
        fetch(_spec(server), tmp_path, sha256="1" * 64)


def test_zip_archive_is_extracted(server, tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("data_ids/dev.json", '[{"_id": "1"}]')
        zf.writestr("data_ids/train.json", "[]")
        zf.writestr("__MACOSX/data_ids/._dev.json", "junk")
    server.files["/d.zip"] = buf.getvalue()
    res = fetch(_spec(server, "/d.zip", unzip=True), tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in res.extracted) == [
        "test-set/data_ids/dev.json", "test-set/data_ids/train.json"]
    assert (tmp_path / "test-set/data_ids/dev.json").read_text() == '[{"_id": "1"}]'
    server.files["/bad.zip"] = b"not a zip"
    with pytest.raises(FetchError, match="not a valid zip archive"):
        fetch(_spec(server, "/bad.zip", unzip=True), tmp_path)


def test_registry_names_and_urls():
    with pytest.raises(ValueError, match=r"unknown dataset 'musique'; expected one of \["):
        get_dataset("musique")
    assert get_dataset("hotpotqa-dev").url == "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json"
    for d in DATASETS.values():
        assert d.url.startswith(("http://", "https://")) and d.filename and d.licence and d.homepage
        assert d.unzip or urlparse(d.url).path.endswith("/" + d.filename)
        assert d.sha256 is None or len(d.sha256) == 64
