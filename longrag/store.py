"""The storage layer: one interface (:class:`Storage`, on ``pyarrow.fs``) over a local folder,
``s3://bucket/prefix`` and ``gs://bucket/prefix``, reading sources (compressed or not, local or
object store) as streams. The parquet codecs of units and chunks are :mod:`longrag.records`.

Generic: it knows nothing of an index build. The build's layout on a storage (manifest, config,
shard folders, FAISS files) is :mod:`longrag.index.artifacts`.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


class ChecksumError(RuntimeError):
    """A stored file's sha256 differs from the one recorded in the manifest."""

    def __init__(self, name: str, expected: str, actual: str) -> None:
        super().__init__(f"checksum mismatch for {name}: expected sha256 {expected}, got {actual}")
        self.name = name
        self.expected = expected
        self.actual = actual

    def __reduce__(self):  # picklable, so the error crosses process boundaries (Ray actors) intact
        return (type(self), (self.name, self.expected, self.actual))


class WriteConflict(RuntimeError):
    """A conditional write (:meth:`Storage.swap_bytes`) found ``key`` holding something other than
    what the caller expected: ``found`` is what it holds now (None: nothing)."""

    def __init__(self, uri: str, key: str, found: bytes | None) -> None:
        super().__init__(f"{key} in {uri} changed since it was read: another writer replaced it first")
        self.uri, self.key, self.found = uri, key, found

    def __reduce__(self):
        return (type(self), (self.uri, self.key, self.found))


#: How long :meth:`Storage.swap_bytes` waits for another writer's lock on a local or shared filesystem.
SWAP_LOCK_TIMEOUT_S = 30.0


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------- storage
class Storage:
    """Flat key/value file access under one folder of a ``pyarrow.fs`` filesystem (local, S3, GCS);
    keys are relative paths with ``/``. :attr:`filesystem` and :meth:`path` hand the same files to
    pyarrow and Ray Data readers (``pq.read_table(storage.path(key), filesystem=storage.filesystem)``,
    ``ray.data.read_parquet(paths, filesystem=...)``).

    pyarrow guesses a compression from a path's extension when it opens a stream; every stream here
    is opened with ``compression=None``: a key's bytes are its bytes (``open_source`` decompresses).

    What is the product's own here is small: the key checks, atomic local writes (temp file +
    rename, so a crash never leaves a torn file under a final name; an object store's PUT is atomic
    already), the compare-and-swap of one small key (:meth:`swap_bytes`), listings of files only (S3
    has directory markers), and errors that name the key."""

    def __init__(self, filesystem: Any, base: str, uri: str) -> None:
        self.filesystem = filesystem
        self.base = base.rstrip("/")
        self.uri = uri
        self._local = isinstance(filesystem, pafs.LocalFileSystem)

    def path(self, key: str) -> str:
        """The filesystem path of ``key``."""
        _check_key(key)
        return f"{self.base}/{key}" if self.base else key

    def _missing(self, key: str) -> FileNotFoundError:
        return FileNotFoundError(f"{key} not found in {self.uri}")

    def read_bytes(self, key: str) -> bytes:
        """Raise FileNotFoundError naming the key when it does not exist."""
        try:
            with self.filesystem.open_input_stream(self.path(key), compression=None) as fh:
                return fh.read()
        except FileNotFoundError:
            raise self._missing(key) from None

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self.path(key)
        if not self._local:
            with self.filesystem.open_output_stream(path, compression=None) as fh:
                fh.write(data)
            return
        folder, _, name = path.rpartition("/")
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def swap_bytes(self, key: str, data: bytes, expected: bytes | None) -> None:
        """Write ``data`` under ``key`` only if ``key`` holds exactly ``expected`` now (None: only if it
        does not exist), as one step against every other ``swap_bytes`` of the key: of two writers that
        read the same old value, one writes and the other gets :class:`WriteConflict` with what the
        first wrote. Readers need no lock (the write itself is atomic, as in :meth:`write_bytes`); a
        plain :meth:`write_bytes` of the key is not ordered against it.

        On a local or shared filesystem: an exclusive ``fcntl.flock`` on a lock file beside the key
        (``.<name>.lock``, left in place: deleting it would let a waiter lock an unlinked file) around
        read, compare, write (temp file + rename). flock rather than an ``O_CREAT|O_EXCL`` or
        ``os.link`` lock file: the kernel drops it when its holder dies, so there is never a stale
        lock to break by age (which no reader can do safely). NFS: Linux clients map flock onto
        NFS byte-range locks (since 2.6.12), which the server arbitrates between hosts on NFSv4, and
        on NFSv3 through lockd; a mount with ``nolock`` (or ``local_lock=flock``) keeps locks on one
        host, and FUSE mounts of object stores often have none: publish through ``s3://`` there.
        On S3 (:class:`S3Storage`): a conditional PUT (``If-Match`` the ETag read, ``If-None-Match: *``
        when absent). Elsewhere (``gs://``) :class:`NotImplementedError`."""
        if not self._local:
            raise NotImplementedError(f"{self.uri}: this store has no conditional write here; keep aliases on "
                                      "a local or shared filesystem or on s3://")
        import fcntl

        path = self.path(key)
        folder, _, name = path.rpartition("/")
        os.makedirs(folder, exist_ok=True)
        fd = os.open(f"{folder}/.{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + SWAP_LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"{key} in {self.uri}: another writer held {folder}/.{name}.lock for "
                                           f"{SWAP_LOCK_TIMEOUT_S:.0f}s") from None
                    time.sleep(0.005)
            try:
                with open(path, "rb") as fh:
                    found: bytes | None = fh.read()
            except FileNotFoundError:
                found = None
            if found != expected:
                raise WriteConflict(self.uri, key, found)
            self.write_bytes(key, data)
        finally:
            os.close(fd)  # releases the lock

    def read_table(self, key: str, columns: list[str] | None = None) -> pa.Table:
        """One parquet file, read by pyarrow through this storage's filesystem (no bytes copy)."""
        return pq.read_table(self.path(key), filesystem=self.filesystem, columns=columns)

    def exists(self, key: str) -> bool:
        return self.filesystem.get_file_info(self.path(key)).type == pafs.FileType.File

    def list(self, prefix: str = "") -> list[str]:
        """All keys under ``prefix`` (recursive; files whose name starts with a dot left out), sorted."""
        folder = prefix.rpartition("/")[0]
        root = f"{self.base}/{folder}".rstrip("/") if self.base else folder
        infos = self.filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        cut = len(self.base) + 1 if self.base else 0
        keys = (info.path[cut:] for info in infos if info.type == pafs.FileType.File)
        return sorted(k for k in keys if k.startswith(prefix) and not k.rpartition("/")[2].startswith("."))

    def delete(self, key: str) -> None:
        """Remove a key; a missing key is not an error."""
        try:
            self.filesystem.delete_file(self.path(key))
        except FileNotFoundError:
            pass

    def upload_file(self, local_path: str | Path, key: str) -> None:
        if self._local:
            self.write_bytes(key, Path(local_path).read_bytes())
            return
        pafs.copy_files(str(local_path), self.path(key), source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=self.filesystem)

    def download_file(self, key: str, local_path: str | Path) -> None:
        if not self.exists(key):
            raise self._missing(key)
        pafs.copy_files(self.path(key), str(local_path), source_filesystem=self.filesystem,
                        destination_filesystem=pafs.LocalFileSystem())

    def open_read(self, key: str, *, seekable: bool = False) -> IO[bytes]:
        """A binary file object reading ``key`` from its start; the caller closes it. A local file is
        opened as one; elsewhere the object is streamed (a multi-GB dump is never held in memory), or,
        with ``seekable`` (parquet readers, multistream offsets), read by ranges as it is asked for.
        Raises FileNotFoundError naming the key when it does not exist."""
        path = self.path(key)
        try:
            if self._local:
                if not os.path.isfile(path):
                    raise FileNotFoundError(path)
                return open(path, "rb")
            if seekable:
                return self.filesystem.open_input_file(path)
            return io.BufferedReader(_StreamReader(self.filesystem.open_input_stream(path, compression=None)), buffer_size=1 << 20)
        except FileNotFoundError:
            raise self._missing(key) from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid storage key {key!r}: use a relative path like 'shards/shard-00000/index.faiss'")
    return key


class LocalStorage(Storage):
    """Files under a local folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        super().__init__(pafs.LocalFileSystem(), self.root.as_posix(), str(self.root))


class S3Storage(Storage):
    """Objects under ``s3://bucket/prefix`` (``pyarrow.fs.S3FileSystem``: credentials and region as the
    AWS SDK finds them). ``endpoint_url`` points at any S3-compatible server (MinIO, moto)."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None) -> None:
        if not bucket:
            raise ValueError("S3Storage needs a bucket name")
        prefix = prefix.strip("/")
        options: dict[str, Any] = {}
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            options["region"] = region
        if endpoint_url:
            scheme, sep, host = endpoint_url.partition("://")
            options.update(endpoint_override=host if sep else endpoint_url, scheme=scheme if sep else "https")
        self.bucket, self.prefix, self.endpoint_url = bucket, prefix, endpoint_url
        self._client: Any = None
        uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        super().__init__(pafs.S3FileSystem(**options), f"{bucket}/{prefix}".rstrip("/"), uri)

    def _s3(self) -> Any:
        """A boto3 S3 client on this storage's endpoint (pyarrow's S3 has no conditional PUT)."""
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", endpoint_url=self.endpoint_url,
                                        region_name=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))
        return self._client

    def _read_versioned(self, key: str) -> tuple[bytes | None, str | None]:
        """``(bytes, ETag)`` of ``key`` now, ``(None, None)`` when it does not exist."""
        from botocore.exceptions import ClientError

        try:
            obj = self._s3().get_object(Bucket=self.bucket, Key=self.path(key)[len(self.bucket) + 1:])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None, None
            raise
        return obj["Body"].read(), obj["ETag"]

    def swap_bytes(self, key: str, data: bytes, expected: bytes | None) -> None:
        """:meth:`Storage.swap_bytes` on S3: read the object and its ETag, compare, then PUT with
        ``If-Match: <ETag>`` (``If-None-Match: *`` when it did not exist): S3 refuses the PUT (412)
        when another write landed in between. A 409 (a conditional write racing this one on S3's
        side) is tried again, reading anew."""
        from botocore.exceptions import ClientError

        for attempt in range(5):
            found, etag = self._read_versioned(key)
            if found != expected:
                raise WriteConflict(self.uri, key, found)
            condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
            try:
                self._s3().put_object(Bucket=self.bucket, Key=self.path(key)[len(self.bucket) + 1:], Body=data,
                                      **condition)
                return
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status == 409 and attempt < 4:
                    time.sleep(0.05 * (attempt + 1))
                    continue
                if status in (409, 412):
                    raise WriteConflict(self.uri, key, self._read_versioned(key)[0]) from None
                raise


class _StreamReader(io.RawIOBase):
    """A read-only, forward-only raw file over a ``read(n)`` stream (an object store's input stream),
    so ``io``/``bz2``/``gzip`` and XML parsers can wrap it like a local file."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._body.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        return n

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


def open_storage(uri: str | Path, *, endpoint_url: str | None = None) -> Storage:
    """``s3://bucket/prefix`` -> :class:`S3Storage` (endpoint: ``endpoint_url`` or
    ``LONGRAG_S3_ENDPOINT_URL``); ``gs://bucket/prefix`` -> a :class:`Storage` on pyarrow's
    ``GcsFileSystem``; a path or ``file://`` URI -> :class:`LocalStorage`."""
    text = str(uri)
    if text.startswith("s3://"):
        bucket, _, prefix = text[len("s3://") :].partition("/")
        endpoint = endpoint_url or os.environ.get("LONGRAG_S3_ENDPOINT_URL")
        return S3Storage(bucket, prefix, endpoint_url=endpoint)
    if text.startswith("gs://"):
        filesystem, path = pafs.FileSystem.from_uri(text)
        return Storage(filesystem, path, text.rstrip("/"))
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise ValueError(f"unsupported store URI {text!r}: use a local path, s3://bucket/prefix or gs://bucket/prefix")
    return LocalStorage(text)


# ---------------------------------------------------------------------------------------- sources
def source_location(source: str | Path, *, endpoint_url: str | None = None) -> tuple[Storage, str]:
    """``(storage of the file's folder, the file's key)`` for one input file: a local path, a
    ``file://`` URI, ``s3://bucket/path/file`` or ``gs://bucket/path/file`` (as in :func:`open_storage`)."""
    text = str(source)
    for scheme in ("s3://", "gs://"):
        if text.startswith(scheme):
            bucket, _, key = text[len(scheme) :].partition("/")
            folder, _, name = key.rstrip("/").rpartition("/")
            if not bucket or not name:
                raise ValueError(f"{text!r} names no object: use {scheme}bucket/path/file")
            return open_storage(f"{scheme}{bucket}/{folder}", endpoint_url=endpoint_url), name
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise ValueError(f"unsupported source {text!r}: use a local path, s3://bucket/path/file or gs://bucket/path/file")
    path = Path(text).expanduser()
    return LocalStorage(path.parent), path.name


@contextmanager
def open_source(
    source: str | Path, *, seekable: bool = False, decompress: bool = True, endpoint_url: str | None = None
) -> Iterator[IO[bytes]]:
    """Open one input file (local or ``s3://``) for binary reading through the storage layer.

    ``.bz2`` and ``.gz`` files are decompressed on the fly unless ``decompress`` is False; S3
    objects are streamed (``seekable=True`` copies them to a temporary file first). A missing file
    raises FileNotFoundError naming ``source``."""
    storage, key = source_location(source, endpoint_url=endpoint_url)
    try:
        raw = storage.open_read(key, seekable=seekable)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"source not found: {source}") from err
    try:
        name = key.lower()
        if decompress and name.endswith(".bz2"):
            with bz2.open(raw, "rb") as fh:
                yield fh
        elif decompress and name.endswith(".gz"):
            with gzip.open(raw, "rb") as fh:
                yield fh
        else:
            yield raw
    finally:
        raw.close()
