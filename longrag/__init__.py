"""LongRAG core library: long retrieval units, MaxP retrieval, long readers, MixPR.

This package never imports Ray. Everything here runs (and is tested) in a plain Python process;
the Ray shells in ``actors/``, ``serve/`` and ``jobs/`` own these objects and add placement,
concurrency, retries and health.

The entry points, importable from here (loaded on first use)::

    from longrag import load_config, plan_build, Embedder, MaxPIndex, ArtifactStore, load_shard
    config = load_config(None, ["units.kind=grouped"])        # the typed config, with --set overrides
    plan = plan_build(docs, config)                           # documents -> long units, shards
    store = ArtifactStore.open("builds/sample")               # a build written by `longrag index`
    index, units = load_shard(store, 0)                       # one shard's MaxP index and its units
    hits = index.search(Embedder(config.embedding).encode_queries(["Who wrote Animal Farm?"]), 4)[0]
    best = units[hits[0].unit_id]                             # merge_topk merges the shards' hits
    reader = LongReader(build_llm(config.llm), config.reader)  # await reader.read(question, units)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "LongRAGConfig": "longrag.config",
    "load_config": "longrag.config",
    "Document": "longrag.types",
    "Unit": "longrag.types",
    "read_documents": "longrag.corpus.documents",
    "plan_build": "longrag.index.plan",
    "Embedder": "longrag.index.embedding",
    "MaxPIndex": "longrag.index.maxp",
    "merge_topk": "longrag.index.maxp",
    "ArtifactStore": "longrag.index.artifacts",
    "load_shard": "longrag.index.artifacts",
    "LongReader": "longrag.reading.reader",
    "build_llm": "longrag.llm.factory",
    "MixPRRetriever": "longrag.mixpr.retriever",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    """The entry points above, imported when first asked for (``import longrag`` stays light)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'longrag' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
