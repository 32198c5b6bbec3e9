"""Glue between retrieval/reader outputs and the evaluation report (pure core, no Ray).

An evaluation run (:mod:`longrag.eval.run`) retrieves units for each question (through Ray actors or
an HTTP endpoint) and optionally runs the reader; these functions turn what it got into the
per-question result dicts of :mod:`longrag.eval.report`, and the report's summary into the flat
``metrics.json`` keys the issue asks for (``retrieval.recall@K``, ``qa.em`` ...), and the
paper-style table of retrieval by unit granularity (LongRAG, Jiang et al., 2024, "LongRAG:
Enhancing Retrieval-Augmented Generation with Long-context LLMs", Section 4.2, Tables 1-2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from longrag.eval import metrics as M
from longrag.eval.datasets import QAExample
from longrag.eval.report import CURVE_KEYS, QA_KEYS

# Which question types count for answer recall by default (LongRAG, Section 4.2: HotpotQA bridge
# questions only, as comparison questions have yes/no or entity answers that are trivially in or
# absent from the text).
DEFAULT_ANSWER_RECALL_TYPES: dict[str, tuple[str, ...] | None] = {"hotpotqa": ("bridge",)}

# The answer-F1 rule of each dataset's own evaluation: LongBench's English QA F1 (plain token F1,
# no yes/no rule; LongBench, Bai et al., 2023, metric ``qa_f1_score``); every other set here is
# scored with the SQuAD/HotpotQA F1, where a yes/no/noanswer mismatch scores 0.
QA_F1_RULES: dict[str, str] = {"longbench": "longbench_qa_f1"}
DEFAULT_QA_F1_RULE = "hotpot_f1"


def qa_f1_rule(dataset: str) -> str:
    """Name of the answer-F1 rule ``dataset`` is scored with (recorded in ``metrics.json``)."""
    return QA_F1_RULES.get(dataset, DEFAULT_QA_F1_RULE)


def qa_f1_metric(dataset: str) -> Callable[[str, Sequence[str]], float]:
    """``f1(prediction, answers)`` of ``dataset``'s own evaluation (see :data:`QA_F1_RULES`)."""
    rule = qa_f1_rule(dataset)
    if rule == "longbench_qa_f1":
        return M.longbench_qa_f1
    return partial(M.f1, hotpot_special=True)


# --------------------------------------------------------------------------------------------- results


def base_result(ex: QAExample, unit_kind: str, reader_k: int | None = None) -> dict[str, Any]:
    """The per-question result dict before retrieval: ids, question, gold answers and titles."""
    r: dict[str, Any] = {
        "qid": ex.qid,
        "question": ex.question,
        "answers": list(ex.answers),
        "type": ex.type,
        "gold_titles": list(ex.gold_titles),
        "gold_paragraphs": [p.text for p in ex.paragraphs if p.is_supporting],
        "unit_kind": unit_kind,
    }
    if reader_k is not None:
        r["reader_k"] = int(reader_k)
    return r


def retrieved_from_hits(hits: Sequence[Any], units: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Ranked ``retrieved`` list from ``UnitHit``-like objects (``unit_id``, ``score``) and the unit
    rows fetched for them (``titles``, ``doc_ids``, ``n_tokens``, ``text``). A hit whose unit row is
    missing raises: a report over silently shortened lists would understate recall."""
    out = []
    for h in hits:
        uid = h.unit_id
        row = units.get(uid)
        if row is None:
            raise ValueError(f"no unit row fetched for retrieved unit {uid!r}")
        out.append(
            {
                "unit_id": uid,
                "score": float(h.score),
                "titles": [str(t) for t in row["titles"]],
                "doc_ids": [str(d) for d in row.get("doc_ids", [])],
                "n_tokens": int(row["n_tokens"]),
                "text": str(row["text"]),
                **({"chunk_scores": [list(c) for c in row["chunk_scores"]]} if row.get("chunk_scores") else {}),
            }
        )
    return out


def retrieved_from_units(units: Sequence[Any]) -> list[dict[str, Any]]:
    """Ranked ``retrieved`` list from :class:`longrag.types.RetrievedUnit` records (a unit that could
    not be fetched raises, as in :func:`retrieved_from_hits`)."""
    rows = {}
    for u in units:
        if u.text is None:
            raise ValueError(f"retrieved unit {u.unit_id!r} was not fetched (its shard did not answer)")
        rows[u.unit_id] = {"titles": u.titles, "doc_ids": u.doc_ids, "n_tokens": u.n_tokens, "text": u.text,
                           "chunk_scores": u.chunk_scores}
    return retrieved_from_hits(units, rows)


def retrieved_from_endpoint(
    units: Sequence[Mapping[str, Any]], doc_texts: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Ranked ``retrieved`` list from a ``/v1/retrieve`` response's ``units``.

    The endpoint returns no unit text; with ``doc_texts`` (doc_id -> ``Title\\ntext`` of the local
    corpus) a unit's text is rebuilt from its documents, which is exact for document and grouped
    units (a grouped unit is its documents joined). Without it, or when a doc id is unknown, the
    unit has no ``text`` and answer recall is left out for that question.
    """
    out = []
    for u in units:
        for key in ("unit_id", "titles", "score", "n_tokens"):
            if key not in u:
                raise ValueError(f"endpoint unit lacks {key!r}: {dict(u)}")
        row: dict[str, Any] = {
            "unit_id": str(u["unit_id"]),
            "score": float(u["score"]),
            "titles": [str(t) for t in u["titles"]],
            "doc_ids": [str(d) for d in u.get("doc_ids", [])],
            "n_tokens": int(u["n_tokens"]),
        }
        if doc_texts is not None and row["doc_ids"] and all(d in doc_texts for d in row["doc_ids"]):
            row["text"] = "\n\n".join(doc_texts[d] for d in row["doc_ids"])
        out.append(row)
    return out


def attach_reader(result: dict[str, Any], reader: Mapping[str, Any]) -> dict[str, Any]:
    """Put a reader's output (a ``ReaderResult.to_dict()`` or an ``/v1/answer`` response flattened
    by the caller) into a result dict: ``prediction``, ``long_answer`` and the cost fields."""
    if "answer" not in reader:
        raise ValueError("reader output has no 'answer'")
    result["prediction"] = str(reader["answer"])
    result["long_answer"] = str(reader.get("long_answer", ""))
    for src, dst in (
        ("context_tokens", "reader_context_tokens"),
        ("prompt_tokens", "prompt_tokens"),
        ("completion_tokens", "completion_tokens"),
    ):
        if reader.get(src) is not None:
            result[dst] = int(reader[src])
    if reader.get("context"):
        result["reader_context"] = str(reader["context"])
    if reader.get("units_used") is not None:
        result["units_used"] = list(reader["units_used"])
        result["reader_units_used"] = len(reader["units_used"])
    if reader.get("truncated") is not None:
        result["reader_truncated"] = bool(reader["truncated"])
    if reader.get("compressed") is not None:
        result["reader_compressed"] = bool(reader["compressed"])
    stages = reader.get("stages_ms") or {}
    if "total" in stages:
        result["reader_s"] = float(stages["total"]) / 1000.0
    return result


def curves_from_json(row: dict[str, Any]) -> dict[str, Any]:
    """A result row read back from ``predictions.jsonl``: JSON made the curves' int keys strings."""
    for key in CURVE_KEYS:
        if isinstance(row.get(key), Mapping):
            row[key] = {int(k): v for k, v in row[key].items()}
    return row


# --------------------------------------------------------------------------------------------- metrics


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def flat_metrics(
    results: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    *,
    dataset: str,
    unit: str,
    reader_k: int | None,
) -> dict[str, Any]:
    """The issue's flat ``metrics.json`` keys for ONE setting (one unit kind) from scored results
    and :func:`longrag.eval.report.summarize` output.

    ``retrieval``: ``recall@K`` (all gold documents in the top K units), ``answer_recall@K``,
    ``context_tokens@K`` (tokens of the top K units). ``qa``: EM / refined EM / F1 means (None
    when the reader did not run). ``avg_context_tokens``: tokens the reader was actually given
    (after fitting its window) when it ran; otherwise the tokens of the top ``reader_k`` units.
    """
    retr_all = summary.get("retrieval", {})
    if len(retr_all) > 1:
        raise ValueError(f"flat_metrics takes one unit kind; got {sorted(retr_all)}")
    retr = next(iter(retr_all.values()), {})
    retrieval: dict[str, Any] = {}
    names = {"gold_recall": "recall", "answer_recall": "answer_recall", "context_tokens": "context_tokens",
             "paragraph_recall": "paragraph_recall", "paragraph_recall_tokens": "paragraph_recall_tokens"}
    for key, name in names.items():
        for k, v in sorted(retr.get(key, {}).items()):
            retrieval[f"{name}@{int(k)}"] = v
        if f"{key}_n" in retr:
            retrieval[f"{name}_n"] = retr[f"{key}_n"]
    qa: dict[str, Any] = {k: _mean(r.get(k) for r in results) for k in QA_KEYS}
    qa["n"] = sum(1 for r in results if r.get("prediction") is not None)
    reader_tokens = _mean(r.get("reader_context_tokens") for r in results)
    if reader_tokens is not None:
        avg_ctx, ctx_source = reader_tokens, "reader"
    else:
        ctx = retr.get("context_tokens", {})
        kk = reader_k if reader_k in ctx else (max(ctx) if ctx else None)
        avg_ctx, ctx_source = (ctx[kk] if kk is not None else None), f"retrieved@{kk}"
    unit_tokens = [u["n_tokens"] for r in results for u in (r.get("retrieved") or [])[:1] if "n_tokens" in u]
    return {
        "dataset": dataset,
        "n": len(results),
        "unit": unit,
        "reader_k": reader_k,
        "retrieval": retrieval,
        "qa": qa,
        "avg_context_tokens": avg_ctx,
        "avg_context_tokens_source": ctx_source,
        "avg_top1_unit_tokens": _mean(unit_tokens),
        "prompt_tokens": _mean(r.get("prompt_tokens") for r in results),
        "completion_tokens": _mean(r.get("completion_tokens") for r in results),
        "reader_s": _mean(r.get("reader_s") for r in results),
        "reader_paragraph_recall": _mean(r.get("reader_paragraph_recall") for r in results),
        "retrieval_s": _mean(r.get("retrieval_s") for r in results),
    }


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * float(v):.1f}"


def _secs(v: Any) -> str:
    return "-" if v is None else f"{float(v):.1f}"


def _num(v: Any) -> str:
    return "-" if v is None else f"{float(v):,.0f}"


def paper_table(runs: Sequence[Mapping[str, Any]], ks: Sequence[int] | None = None) -> str:
    """Markdown table in the layout of LongRAG's Tables 1-2 (Section 4.2): per setting, corpus size in units,
    average unit tokens (corpus / retrieved), and for each k recall, answer recall and context tokens.

    ``runs`` are flat metrics dicts (:func:`flat_metrics`) with optional ``label``, ``corpus_units``
    and ``corpus_avg_unit_tokens`` added by the job."""
    lines = [
        "| setting | corpus units | avg unit tokens (corpus / top-1) | k | R@k (%) | AR@k (%) | context tokens@k |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        retr = run.get("retrieval", {})
        run_ks = sorted({int(key.split("@")[1]) for key in retr if "@" in key})
        for i, k in enumerate([k for k in run_ks if ks is None or k in ks]):
            head = (
                [
                    str(run.get("label") or run.get("unit")),
                    _num(run.get("corpus_units")),
                    f"{_num(run.get('corpus_avg_unit_tokens'))} / {_num(run.get('avg_top1_unit_tokens'))}",
                ]
                if i == 0
                else ["", "", ""]
            )
            lines.append(
                "| "
                + " | ".join(
                    head
                    + [
                        str(k),
                        _pct(retr.get(f"recall@{k}")),
                        _pct(retr.get(f"answer_recall@{k}")),
                        _num(retr.get(f"context_tokens@{k}")),
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def qa_table(runs: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of reader scores per setting (runs without reader output are left out)."""
    rows = [r for r in runs if (r.get("qa") or {}).get("n")]
    if not rows:
        return ""
    lines = [
        "| setting | reader k | n | EM (%) | refined EM (%) | F1 (%) | avg context tokens | reader s/question |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        qa = r["qa"]
        lines.append(
            f"| {r.get('label') or r.get('unit')} | {r.get('reader_k')} | {qa['n']} | {_pct(qa.get('em'))} | "
            f"{_pct(qa.get('refined_em'))} | {_pct(qa.get('f1'))} | {_num(r.get('avg_context_tokens'))} | "
            f"{_secs(r.get('reader_s'))} |"
        )
    return "\n".join(lines)
