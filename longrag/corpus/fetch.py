"""Download the full evaluation sets from their official release URLs (never needed by the tests).

The repository bundles small samples (``data/``, see ``data/README.md``); the full sets are large
and each has its own licence, so they are fetched on request (``python -m jobs.fetch_data``):

* streamed with httpx to ``<file>.part``, with a tqdm progress bar when asked;
* resumable: an interrupted download keeps its ``.part`` file, and the next run asks the server for
  the rest (HTTP ``Range``); a server that ignores the range sends the whole file again;
* verified: the byte count against ``Content-Length``, and the sha256 against the one given by the
  caller or pinned in :data:`DATASETS` (none is pinned yet: the releases publish no checksums, and
  we pin only digests we have checked). A mismatch removes the download and raises
  :class:`ChecksumError`; the digest of every download is reported so a user can pin it;
* zip archives (2WikiMultihopQA) are extracted next to the download.

Written here rather than on ``pooch``: pooch downloads to a temporary file and starts over after an
interruption (no HTTP ``Range`` resume), which for multi-hundred-MB sets on a flaky link is the
feature that matters; the rest (httpx streaming, tqdm, hashlib, zipfile) is the libraries'.

MuSiQue is distributed through Google Drive (its repository's ``download_data.sh`` uses ``gdown``),
which a plain HTTP client cannot fetch reliably; it is not in :data:`DATASETS`.
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from tqdm import tqdm

__all__ = [
    "RemoteDataset",
    "DATASETS",
    "FetchError",
    "ChecksumError",
    "FetchResult",
    "get_dataset",
    "fetch",
    "sha256_file",
]

HOTPOT_BASE = "http://curtis.ml.cmu.edu/datasets/hotpot/"
NQ_OPEN_BASE = "https://raw.githubusercontent.com/google-research-datasets/natural-questions/master/nq_open/"


@dataclass(frozen=True)
class RemoteDataset:
    """One downloadable file of an official release."""

    name: str
    url: str
    filename: str
    description: str
    licence: str
    homepage: str
    sha256: str | None = None  # pinned digest, only when checked against the official file
    unzip: bool = False


DATASETS: dict[str, RemoteDataset] = {
    d.name: d
    for d in (
        RemoteDataset(
            "hotpotqa-dev",
            HOTPOT_BASE + "hotpot_dev_distractor_v1.json",
            "hotpot_dev_distractor_v1.json",
            "HotpotQA dev set, distractor setting (7,405 questions, 10 paragraphs each)",
            "CC BY-SA 4.0",
            "https://hotpotqa.github.io/",
        ),
        RemoteDataset(
            "hotpotqa-dev-fullwiki",
            HOTPOT_BASE + "hotpot_dev_fullwiki_v1.json",
            "hotpot_dev_fullwiki_v1.json",
            "HotpotQA dev set, full-wiki setting",
            "CC BY-SA 4.0",
            "https://hotpotqa.github.io/",
        ),
        RemoteDataset(
            "hotpotqa-train",
            HOTPOT_BASE + "hotpot_train_v1.1.json",
            "hotpot_train_v1.1.json",
            "HotpotQA training set (the bundled 100-question sample comes from it)",
            "CC BY-SA 4.0",
            "https://hotpotqa.github.io/",
        ),
        RemoteDataset(
            "nq-open-dev",
            NQ_OPEN_BASE + "NQ-open.dev.jsonl",
            "NQ-open.dev.jsonl",
            "NQ-open original dev set (3,610 questions, answers only; the bundled file is the "
            "EfficientQA dev set)",
            "CC BY-SA 3.0",
            "https://github.com/google-research-datasets/natural-questions/tree/master/nq_open",
        ),
        RemoteDataset(
            "nq-open-train",
            NQ_OPEN_BASE + "NQ-open.train.jsonl",
            "NQ-open.train.jsonl",
            "NQ-open training set (87,925 questions, answers only)",
            "CC BY-SA 3.0",
            "https://github.com/google-research-datasets/natural-questions/tree/master/nq_open",
        ),
        RemoteDataset(
            "2wikimultihopqa",
            "https://www.dropbox.com/s/ms2m13252h6xubs/data_ids_april7.zip?dl=1",
            "data_ids_april7.zip",
            "2WikiMultihopQA train/dev/test (April 2021 release with evidence ids), a zip archive "
            "extracted next to the download",
            "Apache-2.0",
            "https://github.com/Alab-NII/2wikimultihop",
            unzip=True,
        ),
    )
}


class FetchError(RuntimeError):
    """A download failed (HTTP error, network error, truncated body)."""


class ChecksumError(FetchError):
    """The downloaded bytes do not have the expected sha256."""


@dataclass
class FetchResult:
    dataset: str
    url: str
    path: Path
    n_bytes: int
    sha256: str
    verified: bool  # the sha256 was checked against an expected one
    skipped: bool = False  # the file was already there
    resumed_from: int = 0  # bytes kept from an earlier, interrupted download
    extracted: list[Path] = field(default_factory=list)

    def summary(self) -> str:
        how = "already present" if self.skipped else (
            f"resumed at {self.resumed_from:,} bytes" if self.resumed_from else "downloaded")
        check = "sha256 verified" if self.verified else "sha256 (not pinned)"
        out = f"{self.dataset}: {self.path} ({self.n_bytes:,} bytes, {how}; {check} {self.sha256})"
        if self.extracted:
            out += f"; extracted {len(self.extracted)} files into {self.extracted[0].parent}"
        return out


def get_dataset(name: str) -> RemoteDataset:
    """The registered dataset ``name``; a ValueError names the valid ones."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; expected one of {sorted(DATASETS)}") from None


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk_size), b""):
            h.update(block)
    return h.hexdigest()


def _check_sha(path: Path, expected: str | None, what: str) -> tuple[str, bool]:
    digest = sha256_file(path)
    if expected and digest != expected.lower():
        raise ChecksumError(f"{what}: sha256 {digest} does not match the expected {expected.lower()}")
    return digest, bool(expected)


def _download(client: httpx.Client, url: str, part: Path, progress: bool, chunk_size: int) -> int:
    """Stream ``url`` into ``part``, continuing an existing partial file. Returns the bytes kept
    from before."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    with client.stream("GET", url, headers=headers) as r:
        if r.status_code == 416 and offset:
            return offset  # nothing left to send: the partial file is complete (checked next)
        if r.status_code == 206 and offset:
            mode = "ab"
        elif r.status_code == 200:
            offset, mode = 0, "wb"  # no range support: start over
        else:
            raise FetchError(f"{url}: HTTP {r.status_code} {r.reason_phrase}")
        length = r.headers.get("content-length")
        total = offset + int(length) if length is not None else None
        written = 0
        with open(part, mode) as fh, tqdm(
            total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
            desc=part.name.removesuffix(".part"), disable=not progress, leave=False,
        ) as bar:
            for block in r.iter_bytes(chunk_size):
                fh.write(block)
                written += len(block)
                bar.update(len(block))
        if length is not None and written != int(length):
            raise FetchError(f"{url}: got {written:,} of {int(length):,} bytes")
    return offset


def fetch(
    dataset: RemoteDataset | str,
    out_dir: str | Path,
    *,
    url: str | None = None,
    sha256: str | None = None,
    progress: bool = False,
    timeout: float = 60.0,
    chunk_size: int = 1 << 20,
    client: httpx.Client | None = None,
) -> FetchResult:
    """Download ``dataset`` into ``out_dir`` (from ``url`` instead of the official URL when given,
    e.g. a mirror) and verify it against ``sha256`` (or the pinned digest). A file already in
    ``out_dir`` is checked, not downloaded again. Raises :class:`FetchError` /
    :class:`ChecksumError` with the URL and what to do."""
    spec = get_dataset(dataset) if isinstance(dataset, str) else dataset
    src = url or spec.url
    expected = sha256 or spec.sha256
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dest = out / spec.filename
    part = dest.with_name(dest.name + ".part")

    if dest.exists():
        digest, verified = _check_sha(
            dest, expected, f"{dest} (already present; delete it to download it again)")
        result = FetchResult(spec.name, src, dest, dest.stat().st_size, digest, verified, skipped=True)
    else:
        own = client is None
        http = client or httpx.Client(timeout=timeout, follow_redirects=True)
        try:
            resumed = _download(http, src, part, progress, chunk_size)
        except httpx.HTTPError as exc:
            kept = part.stat().st_size if part.exists() else 0
            hint = f"; run the same command again to resume ({kept:,} bytes kept in {part})" if kept else ""
            raise FetchError(f"{src}: {type(exc).__name__}: {exc}{hint}") from exc
        except FetchError as exc:
            kept = part.stat().st_size if part.exists() else 0
            if kept:
                raise FetchError(f"{exc}; run the same command again to resume ({kept:,} bytes kept in {part})") from None
            part.unlink(missing_ok=True)
            raise
        finally:
            if own:
                http.close()
        try:
            digest, verified = _check_sha(part, expected, f"{src}")
        except ChecksumError as exc:
            part.unlink()
            raise ChecksumError(f"{exc}; the download was removed") from None
        part.replace(dest)
        result = FetchResult(spec.name, src, dest, dest.stat().st_size, digest, verified, resumed_from=resumed)

    if spec.unzip:
        result.extracted = _extract(dest, out / spec.name)
    return result


def _extract(archive: Path, target: Path) -> list[Path]:
    """Extract a zip archive into ``target`` (member paths are sanitised by :mod:`zipfile`)."""
    try:
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/") and not n.startswith("__MACOSX/")]
            for n in names:
                zf.extract(n, target)
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{archive} is not a valid zip archive ({exc}); delete it and fetch again") from None
    return [target / n for n in names]
