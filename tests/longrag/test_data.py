"""The bundled data: where it is found, how it is read, that every file is attributed, and that
nothing in the repository points outside it."""

from __future__ import annotations

import bz2
import gzip
import json
import re
from pathlib import Path

import pytest

import longrag.data as D

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = [
    D.SAMPLE_WIKI, D.HOTPOTQA_SAMPLE, D.HOTPOTQA_CORPUS, D.MUSIQUE_SAMPLE, D.MUSIQUE_CORPUS,
    D.TWOWIKI_EXAMPLE, D.NQ_OPEN_SAMPLE, D.DPR_PASSAGES, D.RULER_TASKS_YAML,
]


def test_data_dir_is_the_repository_data_folder(monkeypatch):
    monkeypatch.delenv(D.DATA_DIR_ENV, raising=False)
    assert D.data_dir() == ROOT / "data" == D.REPO_DATA_DIR
    for rel in BUNDLED:
        assert D.data_path(rel).is_file(), rel


def test_override_and_clear_errors(monkeypatch, tmp_path):
    monkeypatch.setenv(D.DATA_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(D.DataNotFoundError, match=r"LONGRAG_DATA_DIR='.*nope' is not a folder"):
        D.data_dir()
    monkeypatch.setenv(D.DATA_DIR_ENV, str(tmp_path))
    assert D.data_dir() == tmp_path
    with pytest.raises(D.DataNotFoundError, match=r"'hotpotqa/hotpotqa_train100.json.gz' not found in the data "
                                                  r"folder .*; LONGRAG_DATA_DIR is set"):
        D.data_path(D.HOTPOTQA_SAMPLE)
    (tmp_path / "babi").mkdir()
    assert D.data_path("babi") == tmp_path / "babi"


def test_missing_repository_folder_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.delenv(D.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(D, "REPO_DATA_DIR", tmp_path / "site-packages" / "data")
    with pytest.raises(D.DataNotFoundError, match="not in the wheel.*set LONGRAG_DATA_DIR"):
        D.data_dir()


def test_open_text_reads_plain_gzip_and_bz2_alike(tmp_path):
    text = "héllo\nwörld\n"
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "a.txt.BZ2").write_bytes(bz2.compress(text.encode()))
    for name in ("a.txt", "a.txt.gz", "a.txt.BZ2"):
        assert D.read_text(tmp_path / name) == text
        with D.open_text(tmp_path / name) as fh:
            assert fh.readlines() == ["héllo\n", "wörld\n"]
    (tmp_path / "latin.txt.gz").write_bytes(gzip.compress("caf\xe9".encode("latin-1")))
    with pytest.raises(UnicodeDecodeError):
        D.read_text(tmp_path / "latin.txt.gz")
    with D.open_text(tmp_path / "latin.txt.gz", errors="replace") as fh:
        assert fh.read() == "caf\ufffd"


def test_bundled_samples_have_the_documented_sizes():
    # counts from data/README.md, read through the same reader the loaders use
    assert len(json.loads(D.read_text(D.data_path(D.HOTPOTQA_SAMPLE)))) == 100
    assert len(json.loads(D.read_text(D.data_path(D.HOTPOTQA_CORPUS)))) == 994
    assert len(json.loads(D.read_text(D.data_path(D.MUSIQUE_SAMPLE)))) == 100
    assert len(json.loads(D.read_text(D.data_path(D.MUSIQUE_CORPUS)))) == 1890
    assert len(D.read_text(D.data_path(D.DPR_PASSAGES)).splitlines()) == 1000
    assert len(D.read_text(D.data_path(D.NQ_OPEN_SAMPLE)).splitlines()) == 1800
    total = sum(p.stat().st_size for p in (ROOT / "data").rglob("*") if p.is_file())
    assert total < 5_000_000  # the repository stays small: full sets are fetched, not bundled


def test_every_bundled_file_is_listed_with_its_licence():
    readme = (ROOT / "data" / "README.md").read_text(encoding="utf-8")
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    listed = " ".join(rows)
    files = sorted(p.relative_to(ROOT / "data").as_posix() for p in (ROOT / "data").rglob("*")
                   if p.is_file() and p.name not in ("README.md", "ATTRIBUTION.md", "LICENSE")
                   and not p.relative_to(ROOT / "data").as_posix().startswith("full/"))
    assert files
    for rel in files:  # a row names a file by its path, or by its name after the first of its folder
        assert f"`{rel}`" in listed or f"`{rel.rsplit('/', 1)[1]}`" in listed, f"data/{rel} is not in data/README.md"
    for row in rows:
        assert re.search(r"(CC BY|Apache-2.0|MIT)", row.split("|")[-2]), f"no licence in row {row}"


# Paths a user's clone does not have: a sibling folder of the checkout, a developer machine's
# absolute paths. Built from pieces so this file does not match itself.
OUTSIDE = re.compile("|".join([re.escape("../" + "shared"), re.escape("/" + "work/"), re.escape("/" + "home/")]))
# Citations by the file name of a paper the repository does not contain.
PAPER_FILE = re.compile(r"\b[Pp]aper 0\d\d\b|papers/0\d\d_")
# Files other branches own that still cite a paper by file name; the lead removes each when it is fixed.
PAPER_FILE_KNOWN: set[str] = set()
SKIP_DIRS = {".git", ".venv", ".venv-vllm", "artifacts", "reports", "build", "dist", "__pycache__", ".pytest_cache", "full"}


def _text_files():
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts) or not p.is_file():
            continue
        if p.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".sh", ".txt"} or p.name in {"Makefile", "Dockerfile"}:
            if rel.parts[0] == "data" and p.suffix != ".md":
                continue  # third-party data, not ours
            yield rel.as_posix(), p.read_text(encoding="utf-8", errors="replace")


def test_no_path_outside_the_repository():
    bad = [f"{rel}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
           for rel, text in _text_files() for m in OUTSIDE.finditer(text)]
    assert not bad, "paths outside the repository:\n" + "\n".join(bad)


def test_papers_are_cited_by_title_not_by_file():
    bad = [f"{rel}: {m.group(0)}" for rel, text in _text_files() if rel not in PAPER_FILE_KNOWN
           for m in PAPER_FILE.finditer(text)]
    assert not bad, "cite the paper by title and section instead:\n" + "\n".join(bad)
