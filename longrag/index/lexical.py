"""BM25 over one shard's chunks (``bm25s``): the lexical half of ``retrieval.mode=hybrid``.

Built by :func:`longrag.index.artifacts.write_shard` beside the FAISS index, over the same chunks in
the same order (BM25 document ``i`` is FAISS row ``i``, so MaxP per unit reuses the shard's chunk ->
unit map), and stored in the shard's folder as ``bm25/*`` files with their sha256 in the manifest
like every other file. :func:`longrag.index.artifacts.write_shard` is also what ``jobs.update``
calls, so an incremental update rebuilds the lexical part of exactly the shards it rewrites.

Statistics (document frequencies, average chunk length) are the shard's own, as in Elasticsearch's
default ``query_then_fetch``: shards are searched independently and their BM25 scores merged as if
comparable. With shards of thousands of chunks the statistics agree closely; the cost on the
samples is measured in docs/evaluation.md (hybrid, sharded against one process).

Tokenizing: lower case, English stop words removed, no stemming (``bm25s.tokenize``); the query
goes through the same tokenizer. Scoring: bm25s's defaults (Lucene's BM25, k1 = 1.5, b = 0.75).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from longrag.types import InvalidRequest

if TYPE_CHECKING:
    from longrag.index.manifest import Manifest

#: Prefix of the lexical files inside a shard's folder.
LEXICAL_PREFIX = "bm25/"
META_FILE = LEXICAL_PREFIX + "lexical.json"
FORMAT = 1
STOPWORDS = "en"


class LexicalIndexMissing(InvalidRequest):
    """``retrieval.mode=hybrid`` on a build (or shard) written without its BM25 index."""


def lexical_missing(manifest: Manifest) -> list[int]:
    """The shards of the build written without their BM25 files (a build made before hybrid retrieval)."""
    return [s.shard_id for s in manifest.shards if not lexical_file_names(list(s.files))]


def require_lexical(manifest: Manifest) -> None:
    """Raise :class:`LexicalIndexMissing` unless every shard of the build has its BM25 files."""
    missing = lexical_missing(manifest)
    if missing:
        raise LexicalIndexMissing(
            f"retrieval.mode=hybrid needs the BM25 index of every shard, and build {manifest.build_id} was written "
            f"without it (shards {missing}, built before hybrid retrieval): rebuild it with jobs.index, or use "
            "mode=dense")


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    """What BM25 indexes and searches: lower-cased words without English stop words."""
    import bm25s

    return bm25s.tokenize(list(texts), stopwords=STOPWORDS, return_ids=False, show_progress=False)


class LexicalIndex:
    """BM25 scores of ``n_chunks`` chunks (row order = the shard's FAISS order)."""

    def __init__(self, bm25: object | None, n_chunks: int) -> None:
        self.bm25 = bm25  # bm25s.BM25; None for a shard without chunks
        self.n_chunks = n_chunks

    @classmethod
    def build(cls, texts: Sequence[str]) -> LexicalIndex:
        import bm25s

        if not texts:
            return cls(None, 0)
        bm25 = bm25s.BM25()
        bm25.index(bm25s.tokenize(list(texts), stopwords=STOPWORDS, show_progress=False), show_progress=False)
        return cls(bm25, len(texts))

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every chunk for ``query`` (float32, 0 where no query word occurs)."""
        words = tokenize([query])[0]
        if self.bm25 is None or not words:  # an empty shard, or a question of stop words only
            return np.zeros(self.n_chunks, dtype=np.float32)
        return np.asarray(self.bm25.get_scores(words), dtype=np.float32)

    @property
    def vocabulary(self) -> int:
        return 0 if self.bm25 is None else len(self.bm25.vocab_dict)

    # ------------------------------------------------------------------ persistence
    def to_files(self) -> dict[str, bytes]:
        """``{"bm25/<name>": bytes}``: bm25s's own saved files and a small meta file."""
        files = {META_FILE: json.dumps({"format": FORMAT, "n_chunks": self.n_chunks, "stopwords": STOPWORDS,
                                        "vocabulary": self.vocabulary}, indent=2).encode()}
        if self.bm25 is not None:
            with tempfile.TemporaryDirectory() as tmp:
                self.bm25.save(tmp)
                for path in sorted(Path(tmp).iterdir()):
                    files[LEXICAL_PREFIX + path.name] = path.read_bytes()
        return files

    @classmethod
    def from_files(cls, files: dict[str, bytes]) -> LexicalIndex:
        """Inverse of :meth:`to_files` (``files`` may hold other shard files too)."""
        import bm25s

        if META_FILE not in files:
            raise FileNotFoundError(f"no {META_FILE} among the lexical files")
        meta = json.loads(files[META_FILE])
        if meta.get("format") != FORMAT:
            raise ValueError(f"{META_FILE}: format {meta.get('format')!r}, this code reads {FORMAT}")
        saved = {name.removeprefix(LEXICAL_PREFIX): data for name, data in files.items()
                 if name.startswith(LEXICAL_PREFIX) and name != META_FILE}
        if meta["n_chunks"] == 0:
            return cls(None, 0)
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in saved.items():
                (Path(tmp) / name).write_bytes(data)
            bm25 = bm25s.BM25.load(tmp, mmap=False)
        out = cls(bm25, int(meta["n_chunks"]))
        n = int(bm25.scores["num_docs"])
        if n != out.n_chunks:
            raise ValueError(f"{META_FILE} says {out.n_chunks} chunks, the BM25 matrix holds {n}")
        return out


def lexical_file_names(names: Sequence[str]) -> list[str]:
    """The lexical files among a shard's file names."""
    return sorted(n for n in names if n.startswith(LEXICAL_PREFIX))
