"""The reader benchmark's results, as people read them: a summary per setting (EM, F1, refined EM,
seconds, tokens), each setting against the bare prompt at its budget, where the points go (the raw
reply and each finishing step), Markdown tables, the F1-vs-seconds plot, and the report files.

Rows are :func:`lab.reader_bench.run_settings`' (and the long-document benchmark's) dicts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longrag.eval.metrics import exact_match, f1, refined_exact_match


def _by_setting(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["setting"], []).append(r)
    return by


def _pct(scores: Iterable[float]) -> float:
    """Mean of 0..1 scores as a percentage, one decimal."""
    return round(100 * float(np.mean(list(scores))), 1)


def summarize(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setting: questions, EM, F1, refined EM (x100: the gold inside the answer, LongRAG's lenient
    match), mean seconds, prompt tokens, context tokens, fallbacks."""
    out = []
    for label, rs in _by_setting(rows).items():
        out.append({
            "setting": label, "mode": rs[0]["mode"], "budget": rs[0]["budget"], "few_shot": rs[0]["few_shot"],
            "answer_mode": rs[0].get("answer_mode", "two_turn"),
            "questions": len(rs),
            "em": _pct(r["em"] for r in rs),
            "f1": _pct(r["f1"] for r in rs),
            "refined_em": _pct(refined_exact_match(r["answer"], r["golds"]) for r in rs),
            "s_per_q": round(float(np.mean([r["seconds"] for r in rs])), 2),
            "turn1_s_median": round(float(np.median([r["long_s"] for r in rs])), 2),
            "turn2_s_median": round(float(np.median([r["short_s"] for r in rs])), 2),
            "prompt_tokens": round(float(np.mean([r["prompt_tokens"] for r in rs]))),
            "context_tokens": round(float(np.mean([r["context_tokens"] for r in rs]))),
            "fallbacks": sum(1 for r in rs if r["fallback"]),
        })
    return out


def versus_plain(summary: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each reader setting's EM and F1 minus the ``plain`` baseline's at the same budget (the
    smallest plain budget when none matches); empty without a plain setting."""
    plains = {s["budget"]: s for s in summary if s["mode"] == "plain"}
    if not plains:
        return {}
    out = {}
    for s in summary:
        if s["mode"] == "plain":
            continue
        base = plains.get(s["budget"]) or plains[min(plains)]
        out[s["setting"]] = {"vs": base["setting"], "em": round(s["em"] - base["em"], 1),
                             "f1": round(s["f1"] - base["f1"], 1)}
    return out


def attribution(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where the points go, per setting (EM / F1 x100 of the same replies, finished differently):

    * ``raw``: the reply's first non-empty line as it came (the bare prompt's rule);
    * ``cleaned``: :func:`~longrag.reading.reader.clean_short_answer` (prefixes like "The answer is",
      quotes, a trailing period);
    * ``span``: cleaned, then cut to its span when it is a sentence (:func:`reduce_to_span`);
    * ``final``: the answer the reader returned (with yes/no and the guard's replacements);
    * ``long``: two turns only: the long answer's first sentence cut to its span, i.e. what turn 1
      alone would have answered;
    * ``replaced``: answers the guard or the yes/no rule changed, and how many of them gained or lost EM.
    """
    from longrag.reading.answers import clean_short_answer, first_sentence, reduce_to_span

    def first_line(text: str) -> str:
        return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")

    out = []
    for label, rs in _by_setting(rows).items():
        variants: dict[str, list[str]] = {"raw": [], "cleaned": [], "span": [], "final": []}
        long_ans: list[str] = []
        gained = lost = 0
        for r in rs:
            raw = r.get("raw_short_answer") or ""
            cleaned = clean_short_answer(raw)
            span = reduce_to_span(cleaned, r["question"])
            for name, ans in (("raw", first_line(raw)), ("cleaned", cleaned), ("span", span), ("final", r["answer"])):
                variants[name].append(ans)
            if r.get("long_answer"):
                long_ans.append(reduce_to_span(clean_short_answer(first_sentence(r["long_answer"])), r["question"]))
            if r["answer"] != span:
                delta = exact_match(r["answer"], r["golds"]) - exact_match(span, r["golds"])
                gained += delta > 0
                lost += delta < 0
        row: dict[str, Any] = {"setting": label, "questions": len(rs)}
        if len(long_ans) == len(rs) and rs[0].get("answer_mode") == "two_turn":
            variants["long"] = long_ans
        for name, answers in variants.items():
            row[f"{name}_em"] = _pct(exact_match(a, r["golds"]) for a, r in zip(answers, rs))
            row[f"{name}_f1"] = _pct(f1(a, r["golds"]) for a, r in zip(answers, rs))
        row["replaced"] = sum(1 for r in rs if r.get("fallback"))
        row["replaced_gained"], row["replaced_lost"] = int(gained), int(lost)
        out.append(row)
    return out


def attribution_table(dataset: str, rows: Sequence[dict[str, Any]]) -> str:
    """:func:`attribution` as Markdown: EM / F1 per finishing step."""
    head = ("| dataset | setting | raw reply | cleaned | span | final | turn 1 alone | guard: replaced (gained / lost) |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- |")

    def pair(r: dict[str, Any], name: str) -> str:
        return f"{r[name + '_em']} / {r[name + '_f1']}" if f"{name}_em" in r else "-"

    lines = [head] + [
        f"| {dataset} | {r['setting']} | {pair(r, 'raw')} | {pair(r, 'cleaned')} | {pair(r, 'span')} | "
        f"{pair(r, 'final')} | {pair(r, 'long')} | {r['replaced']} ({r['replaced_gained']} / {r['replaced_lost']}) |"
        for r in rows
    ]
    return "\n".join(lines)


def markdown_table(dataset: str, summary: Sequence[dict[str, Any]]) -> str:
    head = ("| dataset | setting | questions | EM | F1 | refined EM | s / question | turn 1 / turn 2 s (median) | "
            "context tokens | prompt tokens (2 turns) | answers replaced |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head] + [
        f"| {dataset} | {s['setting']} | {s['questions']} | {s['em']} | {s['f1']} | {s.get('refined_em', '-')} | "
        f"{s['s_per_q']} | "
        f"{s['turn1_s_median']} / {s['turn2_s_median']} | {s['context_tokens']:,} | {s['prompt_tokens']:,} | "
        f"{s['fallbacks']} |" for s in summary
    ]
    return "\n".join(lines)


def plot_summary(summaries: dict[str, Sequence[dict[str, Any]]], path: Path) -> Path:
    """F1 against seconds per question, one marker per setting and dataset."""
    from longrag.figures import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = {"full": "o", "mixpr": "s", "plain": "x", "longcontext": "^"}
    for dataset, summary in summaries.items():
        for s in summary:
            ax.scatter(s["s_per_q"], s["f1"], marker=markers[s["mode"]], s=50)
            ax.annotate(f"{dataset} {s['setting']}", (s["s_per_q"], s["f1"]), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
    ax.set_xlabel("seconds per question (2 turns, CPU)")
    ax.set_ylabel("F1")
    ax.set_title("Reader: full units (o), MixPR-compressed (s), long document (^), bare prompt (x)")
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=120)


def write_reports(out: Path, name: str, rows: Sequence[dict[str, Any]], report: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """``out/<name>.json`` (``report`` with the settings' summary and the attribution of their
    points) and ``out/<name>.md`` (both tables); returns the tables' text and the summary."""
    summary = summarize(rows)
    causes = attribution(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({**report, "settings": summary, "attribution": causes}, indent=2))
    table = markdown_table(name, summary) + "\n\n" + attribution_table(name, causes)
    (out / f"{name}.md").write_text(table + "\n")
    return table, summary
