"""Shared test setup: offline models, one BLAS/torch thread, the ``gpu`` marker, and the exit.

The exit: after pytest's own teardown (summary printed, every plugin unconfigured) the process ends
with ``os._exit(status)`` instead of a full interpreter finalization. Twice a green run (1,187
passed; 8 scenarios passed) ended in "Segmentation fault" after its summary, exit 139 for the
run: torch, llama.cpp, FAISS, tokenizers and Ray's core worker torn down in one process, with their
thread pools alive, in an order no test controls. What the session opened is closed first, while
every module is whole, by the exit hooks Python would run (Ray's shutdown; llama.cpp models' close,
see ``longrag.llm.llamacpp``). ``LONGRAG_TEST_FINALIZE=1`` keeps the full finalization (to chase it).
"""

from __future__ import annotations

import gc
import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# shard replicas' node-local file cache (longrag.index.shard_cache): one per test session, not the user's
# (Ray processes a test starts inherit it)
if "LONGRAG_SHARD_CACHE" not in os.environ:
    import tempfile

    os.environ["LONGRAG_SHARD_CACHE"] = tempfile.mkdtemp(prefix="longrag-shard-cache-")

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


_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None or os.environ.get("LONGRAG_TEST_FINALIZE") == "1":
        return
    import atexit

    gc.collect()
    atexit._run_exitfuncs()  # Python's own exit hooks (Ray's shutdown, llama.cpp models' close), then no finalization
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@pytest.fixture(scope="session")
def sample_index(tmp_path_factory) -> dict:
    """The bundled enwiki sample indexed once per session (lead sections, grouped units, 2 shards)
    with the real bundled embedding model, on a local Ray of 2 logical CPUs as ``make demo`` builds
    (a stage asking for a whole CPU beside the chunker and the embedding pool waits forever there).
    Starts and stops its own local Ray, so test modules can each start theirs afterwards."""
    from actors.distbuild import build_corpus_index
    from cluster.local import start_or_join
    from longrag.config import load_config

    out = tmp_path_factory.mktemp("sample-index") / "build"
    config = load_config(None, ["units.kind=grouped", "units.text_mode=lead", "index.shards=2"])
    handle = start_or_join(None, num_cpus=2)
    try:
        report = build_corpus_index(str(SAMPLE_WIKI), "wikixml", str(out), config, command=["pytest"])
    finally:
        handle.shutdown()
    return {"uri": str(out), "report": report}
