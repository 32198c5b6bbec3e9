"""Evaluation reports: ``metrics.json``, ``predictions.jsonl``, ``report.md`` and PNG plots.

Pure functions over already-computed results. The input is a list of per-question result dicts,
a config dict and a provenance dict. A result dict has (all but ``qid`` optional):

=================  ========================================================================
``qid``            question id (str)
``question``       question text
``answers``        gold answers (list of str)
``type``           question type (bridge, comparison, 2hop, ...)
``gold_titles``    gold document titles (list of str)
``unit_kind``      ``passage`` / ``document`` / ``grouped`` (default ``"default"``)
``reader_k``       units given to the reader (int), to compare reader settings
``prediction``     short answer (str)
``long_answer``    the reader's first-turn answer (str)
``retrieved``      ranked units: ``[{"unit_id", "titles": [..], "score", "n_tokens", "text"?}]``
``answer_recall``  ``{k: 0/1}``; ``gold_recall``: ``{k: 0/1}``; ``context_tokens``: ``{k: int}``
``em`` ``f1`` ``refined_em``  QA scores (floats)
``latency_s``      seconds for this question (float), or any other numeric field
=================  ========================================================================

:func:`score_results` fills the metric fields from ``prediction``/``retrieved`` where missing;
:func:`summarize` averages them; :func:`write_report` writes the files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from longrag.eval import metrics as M

QA_KEYS = ("em", "refined_em", "f1")
CURVE_KEYS = ("answer_recall", "gold_recall", "context_tokens", "paragraph_recall", "paragraph_recall_tokens")
DEFAULT_KS = (1, 2, 4, 8, 16, 32, 64, 100)


def _check_results(results: Sequence[Mapping[str, Any]]) -> None:
    if not isinstance(results, (list, tuple)):
        raise ValueError(f"results must be a list of dicts, got {type(results).__name__}")
    for i, r in enumerate(results):
        if not isinstance(r, Mapping):
            raise ValueError(f"results[{i}] is a {type(r).__name__}, not a dict")
        if "qid" not in r:
            raise ValueError(f"results[{i}] has no 'qid'")
        for key in CURVE_KEYS:
            if key in r and r[key] is not None and not isinstance(r[key], Mapping):
                raise ValueError(f"results[{i}][{key!r}] must be a dict k -> value")
        if "retrieved" in r and r["retrieved"] is not None and not isinstance(r["retrieved"], list):
            raise ValueError(f"results[{i}]['retrieved'] must be a list of unit dicts")


def score_results(
    results: Sequence[Mapping[str, Any]],
    ks: Iterable[int] = DEFAULT_KS,
    counter: Callable[[str], int] | None = None,
    hotpot_special: bool = True,
    answer_recall_types: Iterable[str] | None = None,
    f1_metric: Callable[[str, Sequence[str]], float] | None = None,
    budgets: Iterable[int] = (),
    truncate: Callable[[str, int], str] | None = None,
) -> list[dict[str, Any]]:
    """Copies of the results with missing metric fields computed.

    ``f1`` is ``f1_metric(prediction, answers)`` when given (e.g. :func:`metrics.longbench_qa_f1`
    for LongBench, see :func:`longrag.eval.pipeline.qa_f1_metric`), else the SQuAD/HotpotQA F1 with
    HotpotQA's yes/no rule when ``hotpot_special``.

    QA scores need ``prediction`` and ``answers``; answer recall needs ``retrieved[i]["text"]``
    and ``answers``; gold recall needs ``retrieved[i]["titles"]`` and non-empty ``gold_titles``;
    context tokens use ``retrieved[i]["n_tokens"]`` or else ``counter(text)``. ks larger than
    the retrieved list are kept (recall there is that of the whole list). ``answer_recall_types``
    restricts answer recall to those question types (LongRAG, Jiang et al., 2024, Section 4.2, uses only
    HotpotQA ``bridge``).

    With ``gold_paragraphs``: ``paragraph_recall`` ({k: share of gold paragraphs inside the top k}),
    ``paragraph_recall_tokens`` ({B: the same inside the first B tokens of the ranked texts}, with
    ``budgets`` and ``truncate(text, n)``) and, when the reader's context is kept
    (``reader_context``), ``reader_paragraph_recall`` (the share the reader was given).
    """
    _check_results(results)
    ks = sorted(set(int(k) for k in ks))
    ar_types = set(answer_recall_types) if answer_recall_types is not None else None
    out = []
    for r in results:
        r = dict(r)
        answers = r.get("answers") or []
        pred = r.get("prediction")
        if pred is not None and answers:
            r.setdefault("em", M.exact_match(pred, answers))
            r.setdefault("refined_em", M.refined_exact_match(pred, answers))
            if f1_metric is not None:
                r.setdefault("f1", float(f1_metric(pred, answers)))
            else:
                r.setdefault("f1", M.f1(pred, answers, hotpot_special=hotpot_special))
        retrieved = r.get("retrieved")
        if retrieved is not None:
            texts = [u.get("text") for u in retrieved]
            if (
                "answer_recall" not in r
                and answers
                and all(isinstance(t, str) for t in texts)
                and (ar_types is None or r.get("type") in ar_types)
            ):
                r["answer_recall"] = M.answer_recall_at_k(texts, answers, ks)
            gold = r.get("gold_titles") or []
            if "gold_recall" not in r and gold and all("titles" in u for u in retrieved):
                r["gold_recall"] = M.gold_recall_at_k([list(u["titles"]) for u in retrieved], gold, ks)
            paragraphs = r.get("gold_paragraphs") or []
            if paragraphs and all(isinstance(t, str) for t in texts):
                if "paragraph_recall" not in r:
                    r["paragraph_recall"] = M.paragraph_recall_at_k(texts, paragraphs, ks)
                if budgets and truncate is not None and "paragraph_recall_tokens" not in r \
                        and all("n_tokens" in u for u in retrieved):
                    r["paragraph_recall_tokens"] = M.paragraph_recall_within(
                        texts, [int(u["n_tokens"]) for u in retrieved], paragraphs, budgets, truncate)
            if "context_tokens" not in r:
                if all("n_tokens" in u for u in retrieved):
                    r["context_tokens"] = M.cumulative_at_k([int(u["n_tokens"]) for u in retrieved], ks)
                elif counter is not None and all(isinstance(t, str) for t in texts):
                    r["context_tokens"] = M.context_tokens_at_k(texts, counter, ks)
        paragraphs = r.get("gold_paragraphs") or []
        if paragraphs and isinstance(r.get("reader_context"), str) and "reader_paragraph_recall" not in r:
            found = M.paragraphs_found(r["reader_context"], paragraphs)
            r["reader_paragraph_recall"] = sum(found) / len(paragraphs)
        out.append(r)
    return out


def _setting(r: Mapping[str, Any]) -> tuple[str, int | None]:
    rk = r.get("reader_k")
    return str(r.get("unit_kind") or "default"), (int(rk) if rk is not None else None)


def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Averages: QA scores per setting (unit kind x reader_k) and per question type, and
    retrieval curves (answer recall, gold recall, context tokens vs k) per unit kind. A question
    that appears under several reader_k settings of one unit kind counts once in the curves."""
    _check_results(results)
    qa: list[dict[str, Any]] = []
    by_setting: dict[tuple[str, int | None], list[Mapping[str, Any]]] = {}
    for r in results:
        by_setting.setdefault(_setting(r), []).append(r)
    for (kind, rk), rows in sorted(by_setting.items(), key=lambda x: (x[0][0], x[0][1] or 0)):
        agg = M.aggregate(rows, group_by="type")
        entry: dict[str, Any] = {"unit_kind": kind, "reader_k": rk, "n": len(rows)}
        for key, st in agg["all"].items():
            if key not in entry:
                entry[key] = st["mean"]
        entry["by_type"] = {
            t: {k: v["mean"] for k, v in g.items() if k in QA_KEYS}
            | {"n": sum(1 for x in rows if str(x.get("type")) == t)}
            for t, g in agg.items()
            if t != "all"
        }
        qa.append(entry)
    retrieval: dict[str, Any] = {}
    kinds: dict[str, dict[str, Mapping[str, Any]]] = {}
    for r in results:
        kinds.setdefault(_setting(r)[0], {}).setdefault(str(r["qid"]), r)
    for kind, per_q in sorted(kinds.items()):
        entry = {"n_questions": len(per_q)}
        for key in CURVE_KEYS:
            curves = [r.get(key) for r in per_q.values() if r.get(key) is not None]
            if curves:
                entry[key] = M.mean_curve(curves)
                entry[f"{key}_n"] = len(curves)
        retrieval[kind] = entry
    return {
        "n_results": len(results),
        "n_questions": len({str(r["qid"]) for r in results}),
        "qa": qa,
        "retrieval": retrieval,
    }


# --------------------------------------------------------------------------------------------- writing


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{100 * v:.1f}" if pct else f"{v:,.1f}"
    return str(v)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(
    summary: Mapping[str, Any],
    config: Mapping[str, Any],
    provenance: Mapping[str, Any],
    title: str = "Evaluation report",
    plots: Sequence[str] = (),
) -> str:
    """The report as markdown: QA table, per-type table, retrieval tables, plots, config, provenance."""
    parts = [f"# {title}", "", f"Questions: {summary['n_questions']} (result rows: {summary['n_results']})", ""]
    qa = [e for e in summary["qa"] if any(e.get(k) is not None for k in QA_KEYS)]
    if qa:
        parts += ["## Answer quality (%)", ""]
        extra = sorted({k for e in qa for k in e if k not in (*QA_KEYS, "unit_kind", "reader_k", "n", "by_type")})
        header = ["unit kind", "reader k", "n", "EM", "refined EM", "F1", *extra]
        rows = [
            [e["unit_kind"], _fmt(e["reader_k"]), str(e["n"]), *(_fmt(e.get(k), pct=True) for k in QA_KEYS)]
            + [_fmt(e.get(k)) for k in extra]
            for e in qa
        ]
        parts += [_table(header, rows), ""]
        type_rows = []
        for e in qa:
            for t, g in e["by_type"].items():
                type_rows.append(
                    [e["unit_kind"], _fmt(e["reader_k"]), t, str(g["n"]), *(_fmt(g.get(k), pct=True) for k in QA_KEYS)]
                )
        if len({r[2] for r in type_rows}) > 1:
            header = ["unit kind", "reader k", "type", "n", "EM", "refined EM", "F1"]
            parts += ["### By question type", "", _table(header, type_rows), ""]
    if any(key in e for e in summary["retrieval"].values() for key in CURVE_KEYS):
        parts += ["## Retrieval", ""]
        for kind, entry in summary["retrieval"].items():
            ks = sorted({int(k) for key in CURVE_KEYS for k in entry.get(key, {})})
            if not ks:
                continue
            parts += [f"### {kind} units ({entry['n_questions']} questions)", ""]
            rows = [
                [
                    str(k),
                    _fmt(entry.get("answer_recall", {}).get(k), pct=True),
                    _fmt(entry.get("gold_recall", {}).get(k), pct=True),
                    _fmt(entry.get("context_tokens", {}).get(k)),
                ]
                for k in ks
            ]
            parts += [_table(["k", "answer recall@k (%)", "gold recall@k (%)", "avg context tokens"], rows), ""]
    if plots:
        parts += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    parts += ["## Config", "", "```json", json.dumps(config, indent=2, sort_keys=True, default=str), "```", ""]
    parts += ["## Provenance", "", _table(["key", "value"], [[str(k), str(v)] for k, v in provenance.items()]), ""]
    return "\n".join(parts)


def _new_axes(xlabel: str, ylabel: str, title: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Any, ax: Any, path: Path) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")


def _k_axis(ax: Any, ks: list[int]) -> None:
    """Log-2 x axis labelled with the plain k values."""
    ax.set_xscale("log", base=2)
    if ks:
        ax.set_xticks(ks)
        ax.set_xticklabels([str(k) for k in ks])
        ax.minorticks_off()


_STYLE = {"answer_recall": ("-", "o", "answer recall"), "gold_recall": ("--", "s", "gold recall")}


def plot_results(summary: Mapping[str, Any], out_dir: str | Path) -> list[str]:
    """PNG plots in the spirit of LongRAG's Figures 3-5 (Jiang et al., 2024,
    Section 4.3). Returns the files written.

    - ``recall_vs_units.png``: recall@k vs number of retrieved units, one line per unit kind;
    - ``recall_vs_tokens.png``: recall vs average context tokens at the same k;
    - ``qa_vs_units.png``: refined EM vs reader k per unit kind (when several reader k were run);
    - ``qa_vs_tokens.png``: refined EM vs context tokens fed to the reader, labelled with recall.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    retr = summary.get("retrieval", {})
    if any(k in e for e in retr.values() for k in _STYLE):
        fig, ax = _new_axes("retrieved units (k)", "recall@k", "Recall vs number of retrieval units")
        for kind, e in retr.items():
            for key, (ls, mk, label) in _STYLE.items():
                if key in e:
                    xs = sorted(e[key])
                    ax.plot(xs, [e[key][x] for x in xs], ls, marker=mk, label=f"{kind}: {label}")
        _k_axis(ax, sorted({int(k) for e in retr.values() for key in _STYLE for k in e.get(key, {})}))
        ax.set_ylim(0, 1.02)
        _save(fig, ax, out / "recall_vs_units.png")
        written.append(str(out / "recall_vs_units.png"))
    if any("context_tokens" in e and any(k in e for k in _STYLE) for e in retr.values()):
        fig, ax = _new_axes("average context tokens", "recall", "Recall vs context length")
        for kind, e in retr.items():
            if "context_tokens" not in e:
                continue
            for key, (ls, mk, label) in _STYLE.items():
                if key in e:
                    xs = sorted(set(e[key]) & set(e["context_tokens"]))
                    xv = [e["context_tokens"][x] for x in xs]
                    ax.plot(xv, [e[key][x] for x in xs], ls, marker=mk, label=f"{kind}: {label}")
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        _save(fig, ax, out / "recall_vs_tokens.png")
        written.append(str(out / "recall_vs_tokens.png"))
    qa = [e for e in summary.get("qa", []) if e.get("reader_k") is not None and e.get("refined_em") is not None]
    kinds = sorted({e["unit_kind"] for e in qa})
    if qa and any(len([e for e in qa if e["unit_kind"] == k]) > 1 for k in kinds):
        fig, ax = _new_axes("units given to the reader", "refined EM", "End performance vs number of units")
        for kind in kinds:
            es = sorted((e for e in qa if e["unit_kind"] == kind), key=lambda e: e["reader_k"])
            ax.plot([e["reader_k"] for e in es], [e["refined_em"] for e in es], "-o", label=kind)
        _k_axis(ax, sorted({e["reader_k"] for e in qa}))
        _save(fig, ax, out / "qa_vs_units.png")
        written.append(str(out / "qa_vs_units.png"))
        pts = []
        for kind in kinds:
            r = retr.get(kind, {})
            toks, rec = r.get("context_tokens", {}), r.get("answer_recall") or r.get("gold_recall") or {}
            es = [e for e in qa if e["unit_kind"] == kind and e["reader_k"] in toks]
            es.sort(key=lambda e: e["reader_k"])
            if es:
                pts.append((kind, es, toks, rec))
        if pts:
            fig, ax = _new_axes("context tokens given to the reader", "refined EM", "End performance vs context length")
            for kind, es, toks, rec in pts:
                xs = [toks[e["reader_k"]] for e in es]
                ys = [e["refined_em"] for e in es]
                ax.plot(xs, ys, "-o", label=kind)
                for e, x, y in zip(es, xs, ys):
                    if e["reader_k"] in rec:
                        label = f"{100 * rec[e['reader_k']]:.0f}"
                        ax.annotate(label, (x, y), textcoords="offset points", xytext=(0, 6), fontsize=7, ha="center")
            ax.set_xscale("log")
            _save(fig, ax, out / "qa_vs_tokens.png")
            written.append(str(out / "qa_vs_tokens.png"))
    return written


def _prediction_row(r: Mapping[str, Any]) -> dict[str, Any]:
    row = {k: v for k, v in r.items() if k != "retrieved"}
    if r.get("retrieved") is not None:
        row["retrieved"] = [{k: v for k, v in u.items() if k not in ("text", "chunk_scores")} for u in r["retrieved"]]
    return row


def write_report(
    out_dir: str | Path,
    results: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any],
    provenance: Mapping[str, Any],
    title: str = "Evaluation report",
    plots: bool = True,
) -> dict[str, str]:
    """Write ``metrics.json``, ``predictions.jsonl`` (unit texts left out), ``report.md`` and plots.

    ``results`` should already be scored (see :func:`score_results`). Returns name -> path.
    """
    _check_results(results)
    if not isinstance(config, Mapping) or not isinstance(provenance, Mapping):
        raise ValueError("config and provenance must be dicts")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    pngs = plot_results(summary, out) if plots else []
    metrics_doc = {
        "summary": summary,
        "config": dict(config),
        "provenance": dict(provenance),
        "plots": [Path(p).name for p in pngs],
    }
    paths = {"metrics": out / "metrics.json", "predictions": out / "predictions.jsonl", "report": out / "report.md"}
    paths["metrics"].write_text(json.dumps(metrics_doc, indent=2, default=str))
    with open(paths["predictions"], "w", encoding="utf-8") as fh:
        for r in results:
            fh.write(json.dumps(_prediction_row(r), default=str, ensure_ascii=False) + "\n")
    paths["report"].write_text(render_markdown(summary, config, provenance, title=title, plots=pngs))
    result = {k: str(v) for k, v in paths.items()}
    for p in pngs:
        result[Path(p).stem] = p
    return result
