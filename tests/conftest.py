"""Shared test setup: offline models, one BLAS/torch thread, the ``gpu`` marker."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from longrag.data import SAMPLE_WIKI as _SAMPLE_WIKI
from longrag.data import data_path

# Every data file the tests read ships in the repository's data/ (see data/README.md); a missing
# one is an error, never a skip.
SAMPLE_WIKI = data_path(_SAMPLE_WIKI)


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sample_index(tmp_path_factory) -> dict:
    """The bundled enwiki sample indexed once per session (lead sections, grouped units, 2 shards)
    with the real bundled embedding model, on a local Ray of 2 logical CPUs as ``make demo`` builds
    (a stage asking for a whole CPU beside the chunker and the embedding pool waits forever there).
    Starts and stops its own local Ray, so test modules can each start theirs afterwards."""
    from cluster.local import start_or_join
    from actors.distbuild import build_corpus_index
    from longrag.config import load_config

    out = tmp_path_factory.mktemp("sample-index") / "build"
    config = load_config(None, ["units.kind=grouped", "units.text_mode=lead", "index.shards=2"])
    handle = start_or_join(None, num_cpus=2)
    try:
        report = build_corpus_index(str(SAMPLE_WIKI), "wikixml", str(out), config, command=["pytest"])
    finally:
        handle.shutdown()
    return {"uri": str(out), "report": report}
