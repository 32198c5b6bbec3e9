"""The fetch_data CLI against a local HTTP server (a mirror URL stands in for the official one)."""

from __future__ import annotations

import hashlib

import pytest

from jobs.fetch_data import main
from longrag.corpus.fetch import DATASETS
from tests.http_server import PAYLOAD, SHA, FileServer


@pytest.fixture
def server():
    with FileServer() as s:
        s.files["/data/file.json"] = PAYLOAD
        yield s


def test_fetch_from_mirror_with_sha256(server, tmp_path, capsys):
    rc = main(["--dataset", "hotpotqa-dev", "--url", server.url("/data/file.json"), "--sha256", SHA,
               "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    out = (tmp_path / "hotpot_dev_distractor_v1.json").read_bytes()
    assert hashlib.sha256(out).hexdigest() == SHA and out == PAYLOAD
    assert "hotpotqa-dev:" in capsys.readouterr().out


def test_failed_download_exits_1_with_the_url(server, tmp_path, capsys):
    url = server.url("/nothing.json")
    rc = main(["--dataset", "nq-open-dev", "--url", url, "--out", str(tmp_path), "--no-progress"])
    assert rc == 1
    assert f"nq-open-dev: FAILED: {url}: HTTP 404" in capsys.readouterr().err
    rc = main(["--dataset", "nq-open-dev", "--url", server.url("/data/file.json"), "--sha256", "ab" * 32,
               "--out", str(tmp_path), "--no-progress"])
    assert rc == 1 and "does not match the expected" in capsys.readouterr().err


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--dataset", "hotpotqa-dev,musique"])
    assert e.value.code == 2 and "unknown dataset 'musique'; expected one of hotpotqa-dev" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--dataset", "hotpotqa-dev,nq-open-dev", "--url", "http://x/y"])
    assert e.value.code == 2 and "exactly one --dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2


def test_list_names_every_dataset(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(d.name in out and d.url in out for d in DATASETS.values())
