"""The storage layer: one interface (:class:`Storage`) over a local folder and ``s3://bucket/prefix``,
reading sources (compressed or not, local or S3) as streams, and the parquet codecs of units and
chunks (:class:`RecordLookup`: rows become records only when asked for).

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
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable, Generic, Iterator, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from longrag.types import Chunk, Unit

UNIT_SCHEMA = pa.schema(
    [
        ("unit_id", pa.string()),
        ("doc_ids", pa.list_(pa.string())),
        ("titles", pa.list_(pa.string())),
        ("text", pa.string()),
        ("n_tokens", pa.int64()),
    ]
)
DOCUMENT_SCHEMA = pa.schema(
    [("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string()), ("links", pa.list_(pa.string()))]
)
CHUNK_SCHEMA = pa.schema(
    [
        ("chunk_id", pa.string()),
        ("unit_id", pa.string()),
        ("position", pa.int32()),
        ("text", pa.string()),
        ("n_tokens", pa.int64()),
    ]
)


class ChecksumError(RuntimeError):
    """A stored file's sha256 differs from the one recorded in the manifest."""

    def __init__(self, name: str, expected: str, actual: str) -> None:
        super().__init__(f"checksum mismatch for {name}: expected sha256 {expected}, got {actual}")
        self.name = name
        self.expected = expected
        self.actual = actual

    def __reduce__(self):  # picklable, so the error crosses process boundaries (Ray actors) intact
        return (type(self), (self.name, self.expected, self.actual))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------- storage
class Storage(ABC):
    """Flat key/value file access under one root; keys are relative paths with ``/``."""

    uri: str

    @abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """Raise FileNotFoundError naming the key when it does not exist."""

    @abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """All keys under ``prefix`` (recursive), sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove a key; a missing key is not an error."""

    def upload_file(self, local_path: str | Path, key: str) -> None:
        self.write_bytes(key, Path(local_path).read_bytes())

    def download_file(self, key: str, local_path: str | Path) -> None:
        Path(local_path).write_bytes(self.read_bytes(key))

    def open_read(self, key: str, *, seekable: bool = False) -> IO[bytes]:
        """A binary file object reading ``key`` from its start; the caller closes it. Streamed where
        the storage can, unless ``seekable`` is asked for (parquet readers seek). Raises
        FileNotFoundError naming the key when it does not exist."""
        return io.BytesIO(self.read_bytes(key))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid storage key {key!r}: use a relative path like 'shards/shard-00000/index.faiss'")
    return key


class LocalStorage(Storage):
    """Files under a local folder; writes are atomic (temp file + rename)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def read_bytes(self, key: str) -> bytes:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"{key} not found in {self.uri}")
        return path.read_bytes()

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def open_read(self, key: str, *, seekable: bool = False) -> IO[bytes]:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"{key} not found in {self.uri}")
        return open(path, "rb")

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        keys = (p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())
        return sorted(k for k in keys if k.startswith(prefix) and not Path(k).name.startswith("."))

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class S3Storage(Storage):
    """Objects under ``s3://bucket/prefix`` through boto3.

    ``endpoint_url`` points at any S3-compatible server (MinIO, moto); when None boto3 follows
    its usual configuration (``AWS_ENDPOINT_URL``, profiles, instance roles).
    """

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, client: Any = None) -> None:
        if not bucket:
            raise ValueError("S3Storage needs a bucket name")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        if client is None:
            import boto3

            client = boto3.client("s3", endpoint_url=endpoint_url)
        self.client = client

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _is_missing(self, err: Exception) -> bool:
        code = str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))
        return code in ("404", "NoSuchKey", "NotFound")

    def read_bytes(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.client.exceptions.ClientError as err:
            if self._is_missing(err):
                raise FileNotFoundError(f"{key} not found in {self.uri}") from err
            raise

    def write_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except self.client.exceptions.ClientError as err:
            if self._is_missing(err):
                return False
            raise

    def list(self, prefix: str = "") -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=base + prefix):
            keys.extend(obj["Key"][len(base) :] for obj in page.get("Contents", []))
        return sorted(keys)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def upload_file(self, local_path: str | Path, key: str) -> None:
        self.client.upload_file(str(local_path), self.bucket, self._key(key))  # multipart for big files

    def download_file(self, key: str, local_path: str | Path) -> None:
        if not self.exists(key):
            raise FileNotFoundError(f"{key} not found in {self.uri}")
        self.client.download_file(self.bucket, self._key(key), str(local_path))

    def open_read(self, key: str, *, seekable: bool = False) -> IO[bytes]:
        """The object's body as a stream (a multi-GB dump is never held in memory); with ``seekable``
        it is first copied into an anonymous temporary file."""
        if seekable:
            if not self.exists(key):
                raise FileNotFoundError(f"{key} not found in {self.uri}")
            fh = tempfile.TemporaryFile()
            try:
                self.client.download_fileobj(self.bucket, self._key(key), fh)
                fh.seek(0)
            except BaseException:
                fh.close()
                raise
            return fh
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except self.client.exceptions.ClientError as err:
            if self._is_missing(err):
                raise FileNotFoundError(f"{key} not found in {self.uri}") from err
            raise
        return io.BufferedReader(_StreamReader(body), buffer_size=1 << 20)


class _StreamReader(io.RawIOBase):
    """A read-only, forward-only raw file over a ``read(n)`` stream (an S3 object body), so
    ``io``/``bz2``/``gzip`` and XML parsers can wrap it like a local file."""

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
    """``s3://bucket/prefix`` -> :class:`S3Storage`; a path or ``file://`` URI -> :class:`LocalStorage`."""
    text = str(uri)
    if text.startswith("s3://"):
        bucket, _, prefix = text[len("s3://") :].partition("/")
        endpoint = endpoint_url or os.environ.get("LONGRAG_S3_ENDPOINT_URL")
        return S3Storage(bucket, prefix, endpoint_url=endpoint)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise ValueError(f"unsupported store URI {text!r}: use a local path or s3://bucket/prefix")
    return LocalStorage(text)


# ---------------------------------------------------------------------------------------- sources
def source_location(source: str | Path, *, endpoint_url: str | None = None) -> tuple[Storage, str]:
    """``(storage of the file's folder, the file's key)`` for one input file: a local path, a
    ``file://`` URI or ``s3://bucket/path/file`` (endpoint as in :func:`open_storage`)."""
    text = str(source)
    if text.startswith("s3://"):
        bucket, _, key = text[len("s3://") :].partition("/")
        folder, _, name = key.rstrip("/").rpartition("/")
        if not bucket or not name:
            raise ValueError(f"{text!r} names no object: use s3://bucket/path/file")
        return open_storage(f"s3://{bucket}/{folder}", endpoint_url=endpoint_url), name
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise ValueError(f"unsupported source {text!r}: use a local path or s3://bucket/path/file")
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


# ---------------------------------------------------------------------------------------- store
# ---------------------------------------------------------------------------------------- records
def units_to_parquet(units: list[Unit]) -> bytes:
    table = pa.Table.from_pylist([u.to_row() for u in units], schema=UNIT_SCHEMA)
    return _table_bytes(table)


def chunks_to_parquet(chunks: list[Chunk]) -> bytes:
    table = pa.Table.from_pylist([c.to_row() for c in chunks], schema=CHUNK_SCHEMA)
    return _table_bytes(table)


def _table_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


T = TypeVar("T")


class RecordLookup(Generic[T]):
    """Records of one parquet table by id; rows become dataclasses only when asked for."""

    def __init__(self, table: pa.Table, key: str, make: Callable[[dict[str, Any]], T]) -> None:
        self.table = table
        self._make = make
        ids = table.column(key).to_pylist()
        self._row = {k: i for i, k in enumerate(ids)}
        if len(self._row) != len(ids):
            raise ValueError(f"duplicate {key} values in the table")

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, key: object) -> bool:
        return key in self._row

    def __iter__(self) -> Iterator[str]:
        return iter(self._row)

    def __getitem__(self, key: str) -> T:
        try:
            row = self._row[key]
        except KeyError:
            raise KeyError(f"{key!r} is not in this shard") from None
        return self._make(self.table.slice(row, 1).to_pylist()[0])

    def get(self, key: str, default: T | None = None) -> T | None:
        return self[key] if key in self._row else default

    def ids(self) -> list[str]:
        return list(self._row)

    def get_many(self, keys: list[str]) -> list[T]:
        """Records for ``keys`` in that order (KeyError on an unknown key)."""
        missing = [k for k in keys if k not in self._row]
        if missing:
            raise KeyError(f"{missing[:5]} not in this shard")
        rows = self.table.take([self._row[k] for k in keys]).to_pylist()
        return [self._make(r) for r in rows]


UnitLookup = RecordLookup[Unit]
ChunkLookup = RecordLookup[Chunk]


def units_from_parquet(data: bytes) -> RecordLookup[Unit]:
    return RecordLookup(pq.read_table(io.BytesIO(data)), "unit_id", Unit.from_row)


def chunks_from_parquet(data: bytes) -> RecordLookup[Chunk]:
    return RecordLookup(pq.read_table(io.BytesIO(data)), "chunk_id", Chunk.from_row)
