"""Stage 1, corpus: read sources into :class:`~longrag.types.Document` records.

:mod:`~longrag.corpus.wikitext` (MediaWiki XML exports to documents, over :mod:`~longrag.corpus.wikixml`: the
streamed pages, :mod:`~longrag.corpus.wikimarkup`: markup stripping and lead sections, and
:mod:`~longrag.corpus.wikititles`: titles, article links, redirects),
:mod:`~longrag.corpus.documents` (JSONL/parquet corpora, Arrow conversion),
:mod:`~longrag.corpus.report` (good/bad record counts of a read),
:mod:`~longrag.corpus.fetch` (download the full public datasets behind the bundled samples).
"""
