"""Stage 1, corpus: read sources into :class:`~longrag.types.Document` records.

:mod:`~longrag.corpus.wikitext` (MediaWiki XML exports: pages, redirects, links, lead sections),
:mod:`~longrag.corpus.documents` (JSONL/parquet corpora, Arrow conversion),
:mod:`~longrag.corpus.report` (good/bad record counts of a read),
:mod:`~longrag.corpus.fetch` (download the full public datasets behind the bundled samples).
"""
