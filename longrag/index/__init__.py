"""Stage 2, index: documents -> long retrieval units -> chunks -> vectors -> sharded exact MaxP search.

:mod:`~longrag.index.grouping` (LongRAG Algorithm 1: documents grouped along links),
:mod:`~longrag.index.units` (units planned on arrays and assembled, shards balanced: every build's path),
:mod:`~longrag.index.chunking` (units cut to the encoder's input), :mod:`~longrag.index.embedding`
(bundled/production encoders), :mod:`~longrag.index.maxp` (exact FAISS shards, MaxP merge),
:mod:`~longrag.index.manifest` (build manifests with checksums and provenance),
:mod:`~longrag.index.capacity` (memory/throughput plan for a corpus size, measured through
:mod:`~lab.tradeoff` on :mod:`~lab.synthetic.vectors` vectors and the FAISS
:mod:`~longrag.index.factories`).
"""
