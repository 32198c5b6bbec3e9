"""A Hugging Face hub cache laid out as ``huggingface-cli download`` leaves it, for tests of how a
hub model name (``bge-large-en-v1.5``) is resolved to local files without the network."""

from __future__ import annotations

from pathlib import Path

import pytest

from longrag.index.embedding import bundled_minilm_path

FAKE_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(root: Path, repo_id: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Lay out ``repo_id`` in a hub cache under ``root`` and point ``huggingface_hub`` at it:
    ``models--ORG--NAME/refs/main`` holds the commit and ``snapshots/<commit>/`` the files, each a
    symlink into ``blobs/`` as in a real cache. The files are the bundled MiniLM's tokenizer files
    (stand-ins: bge-large is not installed here). Returns the snapshot folder."""
    import huggingface_hub.constants as hf_constants

    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / FAKE_COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(FAKE_COMMIT)
    src = bundled_minilm_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "config.json"):
        blob = repo / "blobs" / f"blob-{name}"
        blob.write_bytes((src / name).read_bytes())
        (snapshot / name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(root))
    return snapshot
