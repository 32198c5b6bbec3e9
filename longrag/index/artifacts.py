"""The artifact store: one index build as files under a local folder or ``s3://bucket/prefix``
(on any :class:`longrag.store.Storage`).

Layout of a build (README, Architecture: "Artifacts, not pickles")::

    manifest.json                 Manifest (status "building" until every shard is written)
    unit_graph.parquet            UnitGraph: the units' links (graph expansion), listed in the manifest's artifacts
    shards/shard-00000/
        units.parquet             Unit rows (unit_id, doc_ids, titles, text, n_tokens)
        chunks.parquet            Chunk rows (chunk_id, unit_id, position, text, n_tokens)
        index.faiss, chunk_units.npy, chunk_ids.parquet, unit_ids.parquet, maxp.json   (MaxPIndex)
        bm25/*                    LexicalIndex: BM25 over the same chunks in FAISS order (hybrid mode)
        shard.json                ShardEntry, written last: the shard is complete when it exists

Everything is read and written as bytes through a :class:`Storage`, so loading reads each file
once, checks its sha256 against the manifest, and parses it from memory.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow.parquet as pq

from longrag.index.graph import GRAPH_FILE, GraphMissing, UnitGraph
from longrag.index.lexical import LexicalIndex, lexical_file_names
from longrag.index.manifest import FileEntry, Manifest, ShardEntry
from longrag.index.maxp import INDEX_FILE, INDEX_FILES, MaxPIndex
from longrag.records import (
    RecordLookup,
    chunks_from_parquet,
    chunks_to_parquet,
    documents_to_parquet,
    units_from_parquet,
    units_to_parquet,
)
from longrag.store import ChecksumError, Storage, open_storage, sha256_bytes
from longrag.types import Chunk, Document, Unit

if TYPE_CHECKING:
    from longrag.index.shard_cache import ShardFileCache

MANIFEST_FILE = "manifest.json"
UNITS_FILE = "units.parquet"
CHUNKS_FILE = "chunks.parquet"
SHARD_MARKER = "shard.json"
DOCUMENTS_FILE = "documents.parquet"


class IncompleteBuildError(RuntimeError):
    """The build's manifest is missing or still has status ``building``."""


class ArtifactStore:
    """One index build: its manifest, config and shard folders, on any :class:`Storage`."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    @classmethod
    def open(cls, uri: str | Path, *, endpoint_url: str | None = None) -> ArtifactStore:
        return cls(open_storage(uri, endpoint_url=endpoint_url))

    @property
    def uri(self) -> str:
        return self.storage.uri

    def __repr__(self) -> str:
        return f"ArtifactStore({self.uri!r})"

    @staticmethod
    def shard_prefix(shard_id: int) -> str:
        if not isinstance(shard_id, int) or shard_id < 0:
            raise ValueError(f"shard_id must be a non-negative int, got {shard_id!r}")
        return f"shards/shard-{shard_id:05d}"

    def shard_key(self, shard_id: int, name: str) -> str:
        return f"{self.shard_prefix(shard_id)}/{name}"

    # manifest and config
    def has_manifest(self) -> bool:
        return self.storage.exists(MANIFEST_FILE)

    def read_manifest(self) -> Manifest:
        return Manifest.from_json(self.storage.read_bytes(MANIFEST_FILE))

    def write_manifest(self, manifest: Manifest) -> None:
        self.storage.write_bytes(MANIFEST_FILE, manifest.to_json().encode())

    def status(self) -> Literal["absent", "building", "complete"]:
        """``absent`` (no manifest), ``building`` (started, not finished) or ``complete``."""
        if not self.has_manifest():
            return "absent"
        return self.read_manifest().status

    # shards
    def shard_marker(self, shard_id: int) -> ShardEntry | None:
        """The shard's ``shard.json`` entry if the shard was completely written, else None."""
        key = self.shard_key(shard_id, SHARD_MARKER)
        if not self.storage.exists(key):
            return None
        return ShardEntry.model_validate_json(self.storage.read_bytes(key))

    def completed_shards(self) -> dict[int, ShardEntry]:
        """Shards whose folder holds a ``shard.json`` marker (for resuming a ``building`` build)."""
        out: dict[int, ShardEntry] = {}
        for key in self.storage.list("shards/"):
            if key.endswith("/" + SHARD_MARKER):
                entry = ShardEntry.model_validate_json(self.storage.read_bytes(key))
                out[entry.shard_id] = entry
        return dict(sorted(out.items()))


# ---------------------------------------------------------------------------------------- shards
def write_shard(
    store: ArtifactStore, shard_id: int, units: list[Unit], chunks: list[Chunk], index: MaxPIndex
) -> ShardEntry:
    """Write one shard (units, chunks, index files, the BM25 index of the same chunks, then the
    ``shard.json`` marker).

    Checks that ``index`` covers exactly ``chunks`` with the same chunk -> unit map, and that every
    chunk's unit is in ``units``. The caller adds the returned entry to the manifest.
    """
    unit_ids = [u.unit_id for u in units]
    if len(set(unit_ids)) != len(unit_ids):
        raise ValueError(f"shard {shard_id}: duplicate unit ids")
    if index.ntotal != len(chunks):
        raise ValueError(f"shard {shard_id}: index holds {index.ntotal} vectors for {len(chunks)} chunks")
    indexed = {str(c): str(index.unit_ids[u]) for c, u in zip(index.chunk_ids, index.chunk_units)}
    known_units = set(unit_ids)
    for chunk in chunks:
        if chunk.unit_id not in known_units:
            raise ValueError(f"shard {shard_id}: chunk {chunk.chunk_id} belongs to unit {chunk.unit_id} not in units")
        if indexed.get(chunk.chunk_id) != chunk.unit_id:
            raise ValueError(
                f"shard {shard_id}: chunk {chunk.chunk_id} is indexed under unit {indexed.get(chunk.chunk_id)!r}, "
                f"expected {chunk.unit_id!r}"
            )
    text_of = {c.chunk_id: c.text for c in chunks}
    lexical = LexicalIndex.build([text_of[str(c)] for c in index.chunk_ids])  # FAISS row order
    store.storage.delete(store.shard_key(shard_id, SHARD_MARKER))  # incomplete until rewritten
    files = {UNITS_FILE: units_to_parquet(units), CHUNKS_FILE: chunks_to_parquet(chunks), **index.to_files(),
             **lexical.to_files()}
    entries: dict[str, FileEntry] = {}
    for name, data in files.items():
        store.storage.write_bytes(store.shard_key(shard_id, name), data)
        entries[name] = FileEntry(sha256=sha256_bytes(data), bytes=len(data))
    entry = ShardEntry(shard_id=shard_id, n_units=len(units), n_chunks=len(chunks), files=entries)
    store.storage.write_bytes(store.shard_key(shard_id, SHARD_MARKER), entry.model_dump_json(indent=2).encode())
    return entry


def _shard_entry(store: ArtifactStore, shard_id: int, require_complete: bool) -> tuple[ShardEntry, Manifest | None]:
    if not store.has_manifest():
        if require_complete:
            raise IncompleteBuildError(f"{store.uri} has no {MANIFEST_FILE}")
        marker = store.shard_marker(shard_id)
        if marker is None:
            raise FileNotFoundError(f"shard {shard_id} in {store.uri} was not completely written")
        return marker, None
    manifest = store.read_manifest()
    if manifest.status != "complete" and require_complete:
        raise IncompleteBuildError(f"build {manifest.build_id} in {store.uri} has status {manifest.status!r}")
    try:
        return manifest.shard(shard_id), manifest
    except KeyError:
        if require_complete:
            raise
        marker = store.shard_marker(shard_id)
        if marker is None:
            raise FileNotFoundError(f"shard {shard_id} in {store.uri} was not completely written") from None
        return marker, manifest


def _cached_paths(store: ArtifactStore, entry: ShardEntry, names: list[str], verify: bool,
                  cache: ShardFileCache) -> dict[str, Path]:
    """Local paths of the shard's files through the node-local cache (:mod:`longrag.index.shard_cache`):
    fetched and hashed once per node and content; ``verify=False`` trusts a local store's files as they are."""
    out: dict[str, Path] = {}
    for name in names:
        if name not in entry.files:
            raise FileNotFoundError(f"shard {entry.shard_id} entry lists no file {name}")
        key = store.shard_key(entry.shard_id, name)
        if not verify and getattr(store.storage, "_local", False):
            out[name] = Path(store.storage.path(key))
            continue
        out[name] = cache.path(store.storage, key, entry.files[name].sha256, entry.files[name].bytes)
    return out


def _read_files(store: ArtifactStore, entry: ShardEntry, names: list[str], verify: bool,
                cache: ShardFileCache | None = None) -> dict[str, bytes]:
    if cache is not None:
        return {name: path.read_bytes() for name, path in _cached_paths(store, entry, names, verify, cache).items()}
    out: dict[str, bytes] = {}
    for name in names:
        if name not in entry.files:
            raise FileNotFoundError(f"shard {entry.shard_id} entry lists no file {name}")
        key = store.shard_key(entry.shard_id, name)
        data = store.storage.read_bytes(key)  # FileNotFoundError names the key
        if verify:
            expected = entry.files[name]
            actual = sha256_bytes(data)
            if actual != expected.sha256:
                raise ChecksumError(key, expected.sha256, actual)
            if len(data) != expected.bytes:
                raise ChecksumError(key, f"{expected.sha256} ({expected.bytes} bytes)", f"{actual} ({len(data)} bytes)")
        out[name] = data
    return out


def verify_shard(store: ArtifactStore, shard_id: int, *, require_complete: bool = False) -> ShardEntry:
    """Recompute every file's sha256; raise ChecksumError / FileNotFoundError on the first problem."""
    entry, _ = _shard_entry(store, shard_id, require_complete)
    _read_files(store, entry, sorted(entry.files), verify=True)
    return entry


def load_shard(
    store: ArtifactStore, shard_id: int, *, verify: bool = True, require_complete: bool = True,
    cache: ShardFileCache | None = None,
) -> tuple[MaxPIndex, RecordLookup[Unit]]:
    """Load one shard's index and its units (by unit_id), checking sha256s when ``verify``.

    ``require_complete=False`` also loads a shard of a ``building`` build from its marker. With a
    ``cache`` (:class:`longrag.index.shard_cache.ShardFileCache`) the files come through the node-local
    cache (fetched and hashed once per node) and the FAISS index is memory-mapped from it.
    """
    entry, manifest = _shard_entry(store, shard_id, require_complete)
    if cache is None:
        files = _read_files(store, entry, [*INDEX_FILES, UNITS_FILE], verify)
        index = MaxPIndex.from_files(files)
    else:
        paths = _cached_paths(store, entry, [*INDEX_FILES, UNITS_FILE], verify, cache)
        files = {name: path.read_bytes() for name, path in paths.items() if name != INDEX_FILE}
        index = MaxPIndex.from_files(files, index_path=paths[INDEX_FILE])
    units = units_from_parquet(files[UNITS_FILE])
    if manifest is not None:
        if index.dim != manifest.embedding.dim or index.metric != manifest.metric:
            raise ValueError(
                f"shard {shard_id}: index dim/metric {index.dim}/{index.metric} disagree with the manifest "
                f"{manifest.embedding.dim}/{manifest.metric}"
            )
    if index.ntotal != entry.n_chunks or len(units) != entry.n_units:
        raise ValueError(f"shard {shard_id}: files hold {index.ntotal} chunks / {len(units)} units, entry says "
                         f"{entry.n_chunks} / {entry.n_units}")
    return index, units


def load_shard_lexical(
    store: ArtifactStore, shard_id: int, *, verify: bool = True, require_complete: bool = True,
    cache: ShardFileCache | None = None,
) -> LexicalIndex | None:
    """One shard's BM25 index, or None when the shard was written without one (a build made before
    hybrid retrieval: rebuild it, or ``jobs.update`` rewrites the shards it touches)."""
    entry, _ = _shard_entry(store, shard_id, require_complete)
    names = lexical_file_names(list(entry.files))
    if not names:
        return None
    lexical = LexicalIndex.from_files(_read_files(store, entry, names, verify, cache))
    if lexical.n_chunks != entry.n_chunks:
        raise ValueError(f"shard {shard_id}: BM25 index holds {lexical.n_chunks} chunks, entry says {entry.n_chunks}")
    return lexical


def load_shard_chunks(
    store: ArtifactStore, shard_id: int, *, verify: bool = True, require_complete: bool = True,
    cache: ShardFileCache | None = None,
) -> RecordLookup[Chunk]:
    """One shard's chunk records by chunk_id (chunk text for readers that work on chunks)."""
    entry, _ = _shard_entry(store, shard_id, require_complete)
    return chunks_from_parquet(_read_files(store, entry, [CHUNKS_FILE], verify, cache)[CHUNKS_FILE])


# ---------------------------------------------------------------------------------------- documents
def write_documents(store: ArtifactStore, docs: list[Document]) -> FileEntry:
    """The build's documents, in corpus order, as ``documents.parquet`` (what an incremental update
    regroups from); returns its entry for ``Manifest.artifacts``."""
    data = documents_to_parquet(docs)
    store.storage.write_bytes(DOCUMENTS_FILE, data)
    return FileEntry(sha256=sha256_bytes(data), bytes=len(data))


def _read_artifact(store: ArtifactStore, name: str, verify: bool) -> bytes | None:
    """A build-level file (``Manifest.artifacts``), checked against its sha256; None when the build has none."""
    entry = store.read_manifest().artifacts.get(name)
    if entry is None:
        return None
    data = store.storage.read_bytes(name)
    if verify and sha256_bytes(data) != entry.sha256:
        raise ChecksumError(name, entry.sha256, sha256_bytes(data))
    return data


def read_documents(store: ArtifactStore, *, verify: bool = True) -> list[Document] | None:
    """The build's documents (``documents.parquet``, checked against the manifest), or None when the
    build has none (a build of ``jobs.index`` before it wrote them)."""
    data = _read_artifact(store, DOCUMENTS_FILE, verify)
    if data is None:
        return None
    return [Document.from_row(r) for r in pq.read_table(io.BytesIO(data)).to_pylist()]


def write_unit_graph(store: ArtifactStore, graph: UnitGraph) -> FileEntry:
    """The build's unit link graph (``unit_graph.parquet``, :mod:`longrag.index.graph`); returns its
    entry for ``Manifest.artifacts``."""
    data = graph.to_parquet()
    store.storage.write_bytes(GRAPH_FILE, data)
    return FileEntry(sha256=sha256_bytes(data), bytes=len(data))


def read_unit_graph(store: ArtifactStore, *, verify: bool = True) -> UnitGraph | None:
    """The build's unit link graph, checked against the manifest; None for a build without one
    (built before the graph was kept)."""
    data = _read_artifact(store, GRAPH_FILE, verify)
    return None if data is None else UnitGraph.from_parquet(data)


def require_unit_graph(store: ArtifactStore) -> UnitGraph:
    """The build's unit link graph; :class:`longrag.index.graph.GraphMissing` (a 422 on the API) when
    the build was written without one."""
    graph = read_unit_graph(store)
    if graph is None:
        raise GraphMissing(store.read_manifest().build_id)
    return graph


def copy_shard(src: ArtifactStore, dst: ArtifactStore, shard_id: int) -> ShardEntry:
    """Copy one complete shard of ``src``'s build into ``dst``, checking every file's sha256 against
    ``src``'s manifest (the marker is written last, as :func:`write_shard` does)."""
    entry = src.read_manifest().shard(shard_id)
    files = _read_files(src, entry, sorted(entry.files), verify=True)
    dst.storage.delete(dst.shard_key(shard_id, SHARD_MARKER))
    for name, data in files.items():
        dst.storage.write_bytes(dst.shard_key(shard_id, name), data)
    dst.storage.write_bytes(dst.shard_key(shard_id, SHARD_MARKER), entry.model_dump_json(indent=2).encode())
    return entry


def load_shard_units(store: ArtifactStore, shard_id: int, *, verify: bool = True) -> list[Unit]:
    """One shard's units, in stored order (no index loaded)."""
    entry, _ = _shard_entry(store, shard_id, True)
    lookup = units_from_parquet(_read_files(store, entry, [UNITS_FILE], verify)[UNITS_FILE])
    return lookup.get_many(lookup.ids())
