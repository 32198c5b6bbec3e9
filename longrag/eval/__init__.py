"""Evaluation harness core: dataset loaders, pooled corpora, link builders, metrics, reports.

Modules: :mod:`~longrag.eval.datasets` (QA loaders -> :class:`QAExample`),
:mod:`~longrag.eval.corpus` (pooled corpora -> ``Document``), :mod:`~longrag.eval.links`
(title-mention and TF-IDF links), :mod:`~longrag.eval.metrics` (EM/F1/refined EM/recalls),
:mod:`~longrag.eval.report` (metrics.json, predictions.jsonl, report.md, PNG plots),
:mod:`~longrag.eval.runs` (run directories: write, read back, combine).
``report`` imports matplotlib and ``links`` scikit-learn lazily, so importing this package is cheap.
"""

from longrag.eval.corpus import (
    PooledCorpus,
    load_corpus_file,
    load_dpr_passages,
    pool_examples,
    pool_paragraphs,
    title_doc_id,
)
from longrag.eval.datasets import (
    LoadResult,
    Paragraph,
    QAExample,
    load_2wiki,
    load_hotpotqa,
    load_longbench,
    load_musique,
    load_nq_open,
    load_qa,
)
from longrag.eval.links import build_links, link_stats, tfidf_neighbour_links
from longrag.eval.metrics import (
    aggregate,
    answer_recall_at_k,
    exact_match,
    f1,
    gold_recall_at_k,
    has_answer,
    longbench_qa_f1,
    normalize_answer,
    refined_exact_match,
)
from longrag.index.titles import TitleMatcher, title_mention_links

__all__ = [
    "LoadResult",
    "Paragraph",
    "PooledCorpus",
    "QAExample",
    "TitleMatcher",
    "aggregate",
    "answer_recall_at_k",
    "build_links",
    "exact_match",
    "f1",
    "gold_recall_at_k",
    "has_answer",
    "link_stats",
    "load_2wiki",
    "load_corpus_file",
    "load_dpr_passages",
    "load_hotpotqa",
    "load_longbench",
    "load_musique",
    "load_nq_open",
    "load_qa",
    "longbench_qa_f1",
    "normalize_answer",
    "pool_examples",
    "pool_paragraphs",
    "refined_exact_match",
    "tfidf_neighbour_links",
    "title_doc_id",
    "title_mention_links",
]
