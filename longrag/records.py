"""The parquet codecs of a build's records: units and chunks to parquet bytes and back
(:class:`RecordLookup`: rows become records only when asked for), and the documents' table.

Apart from the storage (:mod:`longrag.store`), which moves bytes and knows nothing of records.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from longrag.corpus.documents import DOCUMENT_SCHEMA
from longrag.types import Chunk, Document, Unit

__all__ = ["CHUNK_SCHEMA", "DOCUMENT_SCHEMA", "UNIT_SCHEMA", "ChunkLookup", "RecordLookup", "UnitLookup",
           "chunks_from_parquet", "chunks_to_parquet", "documents_to_parquet", "table_bytes", "units_from_parquet",
           "units_to_parquet"]

UNIT_SCHEMA = pa.schema(
    [
        ("unit_id", pa.string()),
        ("doc_ids", pa.list_(pa.string())),
        ("titles", pa.list_(pa.string())),
        ("text", pa.string()),
        ("n_tokens", pa.int64()),
    ]
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


def units_to_parquet(units: list[Unit]) -> bytes:
    table = pa.Table.from_pylist([u.to_row() for u in units], schema=UNIT_SCHEMA)
    return table_bytes(table)


def chunks_to_parquet(chunks: list[Chunk]) -> bytes:
    table = pa.Table.from_pylist([c.to_row() for c in chunks], schema=CHUNK_SCHEMA)
    return table_bytes(table)


def table_bytes(table: pa.Table) -> bytes:
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


def documents_to_parquet(docs: list[Document]) -> bytes:
    return table_bytes(pa.Table.from_pylist([d.to_row() for d in docs], schema=DOCUMENT_SCHEMA))
