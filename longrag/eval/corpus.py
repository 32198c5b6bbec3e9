"""Pooled retrieval corpora built from QA sets, and the sets' corpus-form files.

In the distractor settings each question comes with its own small paragraph pool; pooling the
paragraphs of *all* questions into one corpus makes retrieval search every question's distractors.
Paragraphs are de-duplicated by title. Two paragraphs with one title and different texts are a
*conflict*; MuSiQue has many (different paragraphs of one Wikipedia article). The policy decides:

- ``concat`` (default): one document per title, distinct texts joined by a blank line in first-seen
  order (a text already contained in the merged text is not added again);
- ``first``: keep the first text, drop the others;
- ``separate``: keep each distinct text as its own document (same title, doc ids suffixed ``#2``...).

Doc ids are a hash of the title (``t`` + 16 hex digits of sha1), so they are stable across runs,
across input orders, and between the pooled and the corpus-file form of one set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from longrag.eval.datasets import QAExample, iter_paragraphs, join_sentences, read_records
from longrag.types import Document

ConflictPolicy = Literal["concat", "first", "separate"]
MAX_EXAMPLES_KEPT = 10


def title_doc_id(title: str) -> str:
    """Stable document id for a title."""
    return "t" + hashlib.sha1(title.encode("utf-8")).hexdigest()[:16]


def _norm_ws(text: str) -> str:
    return " ".join(text.split())


@dataclass
class PooledCorpus:
    """Documents plus the bookkeeping of how they were pooled."""

    documents: list[Document]
    n_paragraphs: int
    n_duplicates_merged: int
    n_conflicting_titles: int
    n_malformed: int = 0
    policy: str = "concat"
    n_shared_titles: int = 0
    conflict_examples: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def stats(self) -> dict[str, Any]:
        return {
            "paragraphs": self.n_paragraphs,
            "documents": len(self.documents),
            "duplicates_merged": self.n_duplicates_merged,
            "conflicting_titles": self.n_conflicting_titles,
            "texts_conflicted": self.n_conflicting_titles > 0,
            "malformed": self.n_malformed,
            "shared_titles": self.n_shared_titles,
            "policy": self.policy,
        }


def pool_paragraphs(
    paragraphs: Iterable[tuple[str, str]], on_conflict: ConflictPolicy = "concat"
) -> PooledCorpus:
    """De-duplicate ``(title, text)`` paragraphs by title into documents.

    A paragraph whose title was seen before counts as a merged duplicate whatever its text; a
    title counts as conflicting when it was seen with two or more texts that differ after
    whitespace normalization.
    """
    if on_conflict not in ("concat", "first", "separate"):
        raise ValueError(f"on_conflict must be concat, first or separate, not {on_conflict!r}")
    texts: dict[str, list[str]] = {}  # title -> distinct texts, first-seen order
    seen_norm: dict[str, set[str]] = {}
    n_par = 0
    n_dup = 0
    for title, text in paragraphs:
        n_par += 1
        title = title.strip()
        norm = _norm_ws(text)
        if title in texts:
            n_dup += 1
            if norm in seen_norm[title]:
                continue
            seen_norm[title].add(norm)
            texts[title].append(text.strip())
        else:
            texts[title] = [text.strip()]
            seen_norm[title] = {norm}
    docs: list[Document] = []
    conflicts = [t for t, v in texts.items() if len(v) > 1]
    for title, variants in texts.items():
        if len(variants) == 1 or on_conflict == "first":
            docs.append(Document(doc_id=title_doc_id(title), title=title, text=variants[0]))
        elif on_conflict == "concat":
            merged = variants[0]
            for v in variants[1:]:
                if _norm_ws(v) not in _norm_ws(merged):
                    merged = merged + "\n\n" + v
            docs.append(Document(doc_id=title_doc_id(title), title=title, text=merged))
        else:  # separate
            base = title_doc_id(title)
            for k, v in enumerate(variants):
                docs.append(Document(doc_id=base if k == 0 else f"{base}#{k + 1}", title=title, text=v))
    return PooledCorpus(
        documents=docs,
        n_paragraphs=n_par,
        n_duplicates_merged=n_dup,
        n_conflicting_titles=len(conflicts),
        policy=on_conflict,
        conflict_examples=conflicts[:MAX_EXAMPLES_KEPT],
    )


def pool_examples(examples: list[QAExample], on_conflict: ConflictPolicy = "concat") -> PooledCorpus:
    """One corpus from the context paragraphs of all questions of a set."""
    return pool_paragraphs(iter_paragraphs(examples), on_conflict)


def load_corpus_file(
    path: str | Path, on_conflict: ConflictPolicy = "concat"
) -> PooledCorpus:
    """Load a corpus-form file and pool it by title.

    Accepts a HotpotQA-style dict ``title -> [sentences]`` (or ``title -> text``), a list of
    ``{title, text}`` (MuSiQue; ``paragraph_text`` also accepted), or JSONL of the same rows.
    DPR passage files (``{id, contents}``) have their own loader, :func:`load_dpr_passages`.
    """
    records, bad, errors = read_records(path)
    if len(records) == 1 and isinstance(records[0], dict) and not {"title", "text"} <= set(records[0]):
        mapping = records[0]
        pairs: list[tuple[str, str]] = []
        for title, val in mapping.items():
            try:
                if isinstance(val, list):
                    pairs.append((str(title), join_sentences(val)))
                elif isinstance(val, str):
                    pairs.append((str(title), val))
                else:
                    raise ValueError(f"value is {type(val).__name__}")
            except ValueError as exc:
                bad += 1
                if len(errors) < 20:
                    errors.append(f"title {title!r}: {exc}")
        pooled = pool_paragraphs(pairs, on_conflict)
    else:
        pairs = []
        for i, rec in enumerate(records):
            if (
                isinstance(rec, dict)
                and isinstance(rec.get("title"), str)
                and isinstance(rec.get("text", rec.get("paragraph_text")), str)
            ):
                pairs.append((rec["title"], rec.get("text", rec.get("paragraph_text"))))
            else:
                bad += 1
                if len(errors) < 20:
                    errors.append(f"record {i}: not an object with string title and text")
        pooled = pool_paragraphs(pairs, on_conflict)
    pooled.n_malformed = bad
    pooled.errors = errors
    return pooled


def parse_dpr_contents(contents: str) -> tuple[str, str]:
    """Split DPR/pyserini ``contents`` (``"Title"\\ntext``) into title and text."""
    head, sep, rest = contents.partition("\n")
    if not sep:
        raise ValueError("contents has no newline between title and text")
    title = head.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    if not title:
        raise ValueError("empty title")
    return title, rest.strip()


def load_dpr_passages(path: str | Path, limit: int | None = None) -> PooledCorpus:
    """DPR-style 100-word passages as a passage corpus: one Document per passage, ``doc_id`` = the
    file's ``id``. Passages are *not* merged by title (a title has many passages);
    ``n_shared_titles`` counts passages whose title an earlier passage already had."""
    records, bad, errors = read_records(path)
    docs: list[Document] = []
    seen_ids: set[str] = set()
    seen_titles: set[str] = set()
    n_same_title = 0
    for i, rec in enumerate(records):
        if limit is not None and len(docs) >= limit:
            break
        try:
            if not isinstance(rec, dict) or "contents" not in rec or "id" not in rec:
                raise ValueError("record lacks id or contents")
            title, text = parse_dpr_contents(str(rec["contents"]))
            doc_id = str(rec["id"])
            if doc_id in seen_ids:
                raise ValueError(f"duplicate id {doc_id!r}")
        except ValueError as exc:
            bad += 1
            if len(errors) < 20:
                errors.append(f"record {i}: {exc}")
            continue
        seen_ids.add(doc_id)
        if title in seen_titles:
            n_same_title += 1
        seen_titles.add(title)
        docs.append(Document(doc_id=doc_id, title=title, text=text))
    return PooledCorpus(
        documents=docs,
        n_paragraphs=len(docs),
        n_duplicates_merged=0,
        n_conflicting_titles=0,
        n_shared_titles=n_same_title,
        n_malformed=bad,
        policy="none (passages kept)",
        errors=errors,
    )
