"""Loaders for the QA sets the evaluation uses, all mapped to one :class:`QAExample` record.

Supported inputs (each as a JSON list, JSONL, optionally ``.gz``/``.bz2``):

- HotpotQA distractor setting: ``_id, question, answer, type, level, supporting_facts, context``.
- 2WikiMultihopQA original format: like HotpotQA plus ``evidences``, ``entity_ids``, ``answer_id``.
- MuSiQue: ``id, question, answer, answer_aliases, paragraphs[{idx,title,paragraph_text,is_supporting}]``.
- NQ-open: ``question, answer[list]`` (no passages).
- LongBench-style: ``input, context, answers`` (one long context per question, kept in ``meta["context"]``).

Corpus forms (HotpotQA ``title -> [sentences]``, MuSiQue ``[{title, text}]``, DPR ``{id, contents}``) live in
:mod:`longrag.eval.corpus`. A malformed record never aborts a load: it is counted in
:class:`LoadResult` with a short reason, and the load goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from longrag.data import open_text

log = logging.getLogger(__name__)

Format = Literal["auto", "hotpotqa", "2wiki", "musique", "nq_open", "longbench"]
MAX_ERRORS_KEPT = 20


@dataclass
class Paragraph:
    """One titled context paragraph that came with a question (distractor or supporting)."""

    title: str
    text: str
    is_supporting: bool = False


@dataclass
class QAExample:
    """One question with its gold answers and gold evidence.

    ``supporting`` holds ``(title, index)`` pairs: the sentence index for HotpotQA/2Wiki supporting
    facts, the paragraph ``idx`` for MuSiQue supporting paragraphs; empty where the set has none.
    ``gold_titles`` are the distinct titles of the supporting evidence in first-seen order.
    ``paragraphs`` holds the question's own context pool (empty for NQ-open and LongBench).
    """

    qid: str
    question: str
    answers: list[str]
    gold_titles: list[str]
    supporting: list[tuple[str, int]]
    type: str
    meta: dict[str, Any] = field(default_factory=dict)
    paragraphs: list[Paragraph] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadResult:
    """What a loader returns: the examples plus how many records were malformed and why."""

    source: str
    format: str
    examples: list[QAExample]
    n_records: int
    n_malformed: int
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        n_par = sum(len(e.paragraphs) for e in self.examples)
        return {
            "source": self.source,
            "format": self.format,
            "records": self.n_records,
            "questions": len(self.examples),
            "paragraphs": n_par,
            "malformed": self.n_malformed,
            "errors": self.errors[:5],
        }


class MalformedRecord(ValueError):
    """A record that does not have the fields its format needs."""


# --------------------------------------------------------------------------------------------- reading


def read_records(path: str | Path) -> tuple[list[Any], int, list[str]]:
    """Read a JSON list / JSON object / JSONL file. Returns ``(records, n_bad_lines, errors)``.

    A JSON document that is a list yields its items; a dict yields itself as one record; a
    JSONL file yields one record per non-empty line, and a line that does not parse is counted.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"dataset file not found: {p}")
    with open_text(p) as fh:
        raw = fh.read()
    stripped = raw.lstrip()
    if not stripped:
        return [], 0, []
    if stripped[0] == "[":
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}: starts like a JSON list but does not parse: {exc}") from exc
        return list(data), 0, []
    if stripped[0] == "{":
        try:  # one JSON object spanning the whole file
            data = json.loads(raw)
            return [data], 0, []
        except json.JSONDecodeError:
            pass  # JSONL
    records: list[Any] = []
    errors: list[str] = []
    bad = 0
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            bad += 1
            if len(errors) < MAX_ERRORS_KEPT:
                errors.append(f"line {lineno}: invalid JSON ({exc.msg})")
    return records, bad, errors


# --------------------------------------------------------------------------------------------- helpers


def _req(rec: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(rec, dict):
        raise MalformedRecord(f"record is a {type(rec).__name__}, not an object")
    if key not in rec:
        raise MalformedRecord(f"missing field {key!r}")
    val = rec[key]
    if not isinstance(val, kind):
        raise MalformedRecord(f"field {key!r} is {type(val).__name__}, expected {kind}")
    return val


def _nonempty_str(rec: Any, key: str) -> str:
    val = _req(rec, key, str)
    if not val.strip():
        raise MalformedRecord(f"field {key!r} is empty")
    return val


def join_sentences(sentences: list[str]) -> str:
    """Join HotpotQA-style sentences: they carry their own leading spaces (HotpotQA) or none (2Wiki)."""
    out = ""
    for s in sentences:
        if not isinstance(s, str):
            raise MalformedRecord(f"sentence is {type(s).__name__}, not a string")
        if out and s and not s[0].isspace() and not out[-1].isspace():
            out += " "
        out += s
    return out.strip()


def _distinct(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def _context_paragraphs(rec: dict, gold: set[str]) -> list[Paragraph]:
    ctx = _req(rec, "context", list)
    paras = []
    for item in ctx:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)):
            raise MalformedRecord("context item is not [title, sentences]")
        title, sents = item
        if not isinstance(sents, list):
            raise MalformedRecord(f"context {title!r}: sentences is not a list")
        paras.append(Paragraph(title=title, text=join_sentences(sents), is_supporting=title in gold))
    return paras


def _supporting_facts(rec: dict) -> list[tuple[str, int]]:
    sf = _req(rec, "supporting_facts", list)
    out = []
    for item in sf:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)):
            raise MalformedRecord("supporting_facts item is not [title, sent_id]")
        out.append((item[0], int(item[1])))
    return out


# --------------------------------------------------------------------------------------------- parsers


def parse_hotpotqa(rec: Any, i: int) -> QAExample:
    """One HotpotQA distractor-setting record."""
    question = _nonempty_str(rec, "question")
    answer = _req(rec, "answer", str)
    supporting = _supporting_facts(rec)
    gold = _distinct([t for t, _ in supporting])
    paras = _context_paragraphs(rec, set(gold))
    meta = {"level": rec.get("level"), "source_format": "hotpotqa"}
    return QAExample(
        qid=str(rec.get("_id", i)),
        question=question,
        answers=[answer],
        gold_titles=gold,
        supporting=supporting,
        type=str(rec.get("type", "")),
        meta=meta,
        paragraphs=paras,
    )


def parse_2wiki(rec: Any, i: int) -> QAExample:
    """One 2WikiMultihopQA record (original format); evidence triples go to ``meta``."""
    ex = parse_hotpotqa(rec, i)
    ex.meta = {
        "source_format": "2wiki",
        "evidences": rec.get("evidences"),
        "entity_ids": rec.get("entity_ids"),
        "answer_id": rec.get("answer_id"),
    }
    return ex


def parse_musique(rec: Any, i: int) -> QAExample:
    """One MuSiQue record; ``answers`` = answer + aliases; gold = titles of supporting paragraphs."""
    question = _nonempty_str(rec, "question")
    answer = _req(rec, "answer", str)
    aliases = rec.get("answer_aliases") or []
    if not isinstance(aliases, list):
        raise MalformedRecord("answer_aliases is not a list")
    paras_raw = _req(rec, "paragraphs", list)
    paras: list[Paragraph] = []
    supporting: list[tuple[str, int]] = []
    for j, p in enumerate(paras_raw):
        title = _req(p, "title", str)
        text = _req(p, "paragraph_text", str)
        sup = bool(p.get("is_supporting", False))
        paras.append(Paragraph(title=title, text=text.strip(), is_supporting=sup))
        if sup:
            supporting.append((title, int(p.get("idx", j))))
    qid = str(rec.get("id", i))
    answerable = rec.get("answerable", True)
    return QAExample(
        qid=qid,
        question=question,
        answers=_distinct([answer, *[str(a) for a in aliases]]),
        gold_titles=_distinct([t for t, _ in supporting]),
        supporting=supporting,
        type=qid.split("__")[0] if "__" in qid else "musique",
        meta={
            "source_format": "musique",
            "answerable": answerable,
            "question_decomposition": rec.get("question_decomposition"),
        },
        paragraphs=paras,
    )


def parse_nq_open(rec: Any, i: int) -> QAExample:
    """One NQ-open record: ``question`` and an ``answer`` list (a bare string is accepted)."""
    question = _nonempty_str(rec, "question")
    ans = _req(rec, "answer", (list, str))
    answers = [ans] if isinstance(ans, str) else [str(a) for a in ans]
    if not answers:
        raise MalformedRecord("answer list is empty")
    return QAExample(
        qid=str(rec.get("id", rec.get("qid", i))),
        question=question,
        answers=answers,
        gold_titles=[],
        supporting=[],
        type="open",
        meta={"source_format": "nq_open"},
    )


def parse_longbench(rec: Any, i: int) -> QAExample:
    """One LongBench record; its long context is kept as one string in ``meta["context"]``."""
    question = _req(rec, "input", str)
    context = _req(rec, "context", str)
    answers = _req(rec, "answers", list)
    if not answers:
        raise MalformedRecord("answers list is empty")
    return QAExample(
        qid=str(rec.get("_id", i)),
        question=question,
        answers=[str(a) for a in answers],
        gold_titles=[],
        supporting=[],
        type=str(rec.get("dataset", "longbench")),
        meta={
            "source_format": "longbench",
            "context": context,
            "length": rec.get("length"),
            "language": rec.get("language"),
            "all_classes": rec.get("all_classes"),
        },
    )


PARSERS: dict[str, Callable[[Any, int], QAExample]] = {
    "hotpotqa": parse_hotpotqa,
    "2wiki": parse_2wiki,
    "musique": parse_musique,
    "nq_open": parse_nq_open,
    "longbench": parse_longbench,
}


def detect_format(record: Any) -> str:
    """Guess a record's format from its keys (the first well-formed record of a file decides)."""
    if not isinstance(record, dict):
        raise ValueError(f"cannot detect the format of a {type(record).__name__} record")
    keys = set(record)
    if "paragraphs" in keys and "question" in keys:
        return "musique"
    if {"supporting_facts", "context"} <= keys:
        return "2wiki" if ("evidences" in keys or "entity_ids" in keys) else "hotpotqa"
    if {"input", "context", "answers"} <= keys:
        return "longbench"
    if {"question", "answer"} <= keys:
        return "nq_open"
    raise ValueError(f"unknown QA record format with keys {sorted(keys)[:12]}")


def load_qa(path: str | Path, fmt: Format = "auto", limit: int | None = None) -> LoadResult:
    """Load a QA file in any supported format (``fmt="auto"`` detects it from the records)."""
    records, bad_lines, errors = read_records(path)
    if fmt == "auto":
        fmt_found = None
        for r in records:
            try:
                fmt_found = detect_format(r)
                break
            except ValueError:
                continue
        if fmt_found is None:
            raise ValueError(f"{path}: could not detect the QA format (no recognizable record)")
        fmt = fmt_found  # type: ignore[assignment]
    if fmt not in PARSERS:
        raise ValueError(f"unknown format {fmt!r}; known: {sorted(PARSERS)}")
    parse = PARSERS[fmt]
    examples: list[QAExample] = []
    n_bad = bad_lines
    for i, rec in enumerate(records):
        if limit is not None and len(examples) >= limit:
            break
        try:
            examples.append(parse(rec, i))
        except (MalformedRecord, TypeError, ValueError, KeyError) as exc:
            n_bad += 1
            if len(errors) < MAX_ERRORS_KEPT:
                errors.append(f"record {i}: {exc}")
    if n_bad:
        log.warning("%s: %d malformed records skipped (first: %s)", path, n_bad, errors[:1])
    return LoadResult(
        source=str(path),
        format=str(fmt),
        examples=examples,
        n_records=len(records) + bad_lines,
        n_malformed=n_bad,
        errors=errors,
    )


def load_hotpotqa(path: str | Path, limit: int | None = None) -> LoadResult:
    return load_qa(path, "hotpotqa", limit)


def load_2wiki(path: str | Path, limit: int | None = None) -> LoadResult:
    return load_qa(path, "2wiki", limit)


def load_musique(path: str | Path, limit: int | None = None) -> LoadResult:
    return load_qa(path, "musique", limit)


def load_nq_open(path: str | Path, limit: int | None = None) -> LoadResult:
    return load_qa(path, "nq_open", limit)


def load_longbench(path: str | Path, limit: int | None = None) -> LoadResult:
    return load_qa(path, "longbench", limit)


def iter_paragraphs(examples: list[QAExample]) -> Iterator[tuple[str, str]]:
    """All (title, text) context paragraphs of a set of questions, in order."""
    for ex in examples:
        for p in ex.paragraphs:
            yield p.title, p.text
