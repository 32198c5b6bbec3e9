"""The dual-perspective evaluation's report (:mod:`lab.dual_bench` runs it): per strategy and
dataset EM / F1, generator input tokens and the filter's quality (Table 3 and Figure 3 of Zhao et
al., 2024), the reranker's rows, the plot, and the comparison of two runs (a base model against its
fine-tuned LoRA)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longrag.config import DUAL_STRATEGIES
from longrag.data import HOTPOTQA_SAMPLE, MUSIQUE_SAMPLE
from longrag.dual.rerank import DENSE_ONLY

__all__ = [
    "DATASETS",
    "RERANKED",
    "nan_mean",
    "summarize",
    "filter_quality",
    "compare_summaries",
    "table3_markdown",
    "tokens_markdown",
    "reranker_markdown",
    "plot_table3",
    "load_report",
    "write_comparison",
]

#: Bundled datasets of the evaluation, in Table 3's column order: name -> data file under ``data/``.
DATASETS: dict[str, str] = {"musique": MUSIQUE_SAMPLE, "hotpotqa": HOTPOTQA_SAMPLE}
#: The retrieval label of rows answered over reranked chunks (dense-only rows: ``DENSE_ONLY``).
RERANKED = "reranked"


def nan_mean(xs: Iterable[float]) -> float:
    """The mean of the values that are not NaN (NaN when none is)."""
    v = [x for x in xs if x == x]  # drop NaN
    return float(np.mean(v)) if v else float("nan")


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (retrieval, strategy, dataset): questions, EM and F1 (x100), generator input tokens,
    LLM calls and prompt tokens per question (shared stages counted for every strategy that uses
    them: what the strategy costs alone) and the support recall of the chunks (x100)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["retrieval"], r["strategy"], r["dataset"]), []).append(r)
    order = {s: i for i, s in enumerate(DUAL_STRATEGIES)}
    out = []
    for (ret, strat, ds), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != DENSE_ONLY, order[kv[0][1]], kv[0][2])):
        out.append({
            "retrieval": ret, "strategy": strat, "dataset": ds, "questions": len(rs),
            "em": round(100 * nan_mean(r["em"] for r in rs), 1),
            "f1": round(100 * nan_mean(r["f1"] for r in rs), 1),
            "generator_input_tokens": round(nan_mean(r["generator_input_tokens"] for r in rs)),
            "llm_calls": round(nan_mean(r["llm_calls"] for r in rs), 1),
            "prompt_tokens": round(nan_mean(r["prompt_tokens"] for r in rs)),
            "support_recall": round(100 * nan_mean(r["support_recall"] for r in rs), 1),
            "kept_of_retrieved": f"{nan_mean(r['kept'] for r in rs):.1f}/{nan_mean(r['retrieved'] for r in rs):.1f}",
            **filter_quality(rs),
        })  # fmt: skip
    return out


def filter_quality(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The kept chunks judged against the support labels, pooled over ``rows`` (x100):
    ``filter_precision`` = kept chunks from supporting paragraphs / kept chunks,
    ``filter_recall`` = kept chunks from supporting paragraphs / retrieved ones. Without a filter
    (R&B, R&L, Ext keep every chunk) precision is the share of supporting chunks retrieved and
    recall is 100. NaN when no row has the counts (rows from before they were recorded)."""
    rs = [r for r in rows if "kept_supporting" in r]
    kept, kept_sup = sum(r["kept"] for r in rs), sum(r["kept_supporting"] for r in rs)
    ret_sup = sum(r["retrieved_supporting"] for r in rs)
    return {
        "filter_precision": round(100 * kept_sup / kept, 1) if kept else float("nan"),
        "filter_recall": round(100 * kept_sup / ret_sup, 1) if ret_sup else float("nan"),
    }


def compare_summaries(
    baseline: Sequence[dict[str, Any]], candidate: Sequence[dict[str, Any]], labels: tuple[str, str] = ("base", "tuned"),
    retrieval: str = DENSE_ONLY,
) -> tuple[list[dict[str, Any]], str]:
    """Two runs over the same questions side by side (e.g. a base model and its fine-tuned
    adapter): per strategy and dataset, F1, EM and the filter's precision/recall in each, and the
    F1 difference. Returns the rows and a markdown table."""
    rows = []
    for s in _strategies(candidate, retrieval):
        for d in _datasets(candidate):
            a = {k: _cell(baseline, retrieval, s, d, k) for k in ("questions", "em", "f1", "filter_precision", "filter_recall")}
            b = {k: _cell(candidate, retrieval, s, d, k) for k in ("questions", "em", "f1", "filter_precision", "filter_recall")}
            if a["questions"] is None or b["questions"] is None:
                continue
            rows.append({"strategy": s, "dataset": d, "questions": b["questions"],
                         **{f"{k}_{labels[0]}": a[k] for k in ("em", "f1", "filter_precision", "filter_recall")},
                         **{f"{k}_{labels[1]}": b[k] for k in ("em", "f1", "filter_precision", "filter_recall")},
                         "f1_delta": round(b["f1"] - a["f1"], 1)})  # fmt: skip
    x, y = labels
    md = [f"| strategy | dataset | q | F1 {x} -> {y} (delta) | EM {x} -> {y} | filter precision {x} -> {y} "
          f"| filter recall {x} -> {y} |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        md.append(f"| {r['strategy']} | {r['dataset']} | {r['questions']} | {r[f'f1_{x}']} -> {r[f'f1_{y}']} "
                  f"({r['f1_delta']:+.1f}) | {r[f'em_{x}']} -> {r[f'em_{y}']} | {r[f'filter_precision_{x}']} -> "
                  f"{r[f'filter_precision_{y}']} | {r[f'filter_recall_{x}']} -> {r[f'filter_recall_{y}']} |")
    return rows, "\n".join(md)


def _cell(summary: Sequence[dict[str, Any]], ret: str, strat: str, ds: str, key: str) -> Any:
    for s in summary:
        if (s["retrieval"], s["strategy"], s["dataset"]) == (ret, strat, ds):
            return s[key]
    return None


def _strategies(summary: Sequence[dict[str, Any]], ret: str) -> list[str]:
    return [s for s in DUAL_STRATEGIES if any(x["strategy"] == s and x["retrieval"] == ret for x in summary)]


def _datasets(summary: Sequence[dict[str, Any]]) -> list[str]:
    return [d for d in DATASETS if any(x["dataset"] == d for x in summary)]


def table3_markdown(summary: Sequence[dict[str, Any]], retrieval: str = DENSE_ONLY) -> str:
    """The paper's Table 3 layout: strategies as rows, F1 per dataset and their average."""
    ds = _datasets(summary)
    n = {d: _cell(summary, retrieval, _strategies(summary, retrieval)[0], d, "questions") for d in ds}
    head = "| strategy | " + " | ".join(f"{d} F1 ({n[d]} q)" for d in ds) + " | avg F1 |"
    lines = [head, "| --- |" + " --- |" * (len(ds) + 1)]
    for s in _strategies(summary, retrieval):
        vals = [_cell(summary, retrieval, s, d, "f1") for d in ds]
        avg = round(float(np.mean([v for v in vals if v is not None])), 1)
        lines.append(f"| {s} | " + " | ".join(str(v) for v in vals) + f" | {avg} |")
    return "\n".join(lines)


def tokens_markdown(summary: Sequence[dict[str, Any]], retrieval: str = DENSE_ONLY) -> str:
    """Generator input tokens (Figure 3), LLM calls and all prompt tokens per question."""
    ds = _datasets(summary)
    head = ("| strategy | " + " | ".join(f"{d}: generator input / LLM calls / all prompt tokens" for d in ds)
            + " | kept chunks (filter) |")
    lines = [head, "| --- |" + " --- |" * (len(ds) + 1)]
    for s in _strategies(summary, retrieval):
        cells = [
            f"{_cell(summary, retrieval, s, d, 'generator_input_tokens'):,} / {_cell(summary, retrieval, s, d, 'llm_calls')}"
            f" / {_cell(summary, retrieval, s, d, 'prompt_tokens'):,}"
            for d in ds
        ]
        kept = ", ".join(f"{d} {_cell(summary, retrieval, s, d, 'kept_of_retrieved')}" for d in ds)
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {kept} |")
    return "\n".join(lines)


def reranker_markdown(summary: Sequence[dict[str, Any]]) -> str:
    """Dense only vs reranked: support recall of the k chunks and F1 of the reranked strategies."""
    ds = _datasets(summary)
    head = "| retrieval | strategy | " + " | ".join(f"{d} support recall / F1" for d in ds) + " |"
    lines = [head, "| --- | --- |" + " --- |" * len(ds)]
    for s in _strategies(summary, RERANKED):
        for ret in (DENSE_ONLY, RERANKED):
            cells = [f"{_cell(summary, ret, s, d, 'support_recall')} / {_cell(summary, ret, s, d, 'f1')}" for d in ds]
            lines.append(f"| {ret} | {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_table3(summary: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Two panels: F1 per strategy and dataset (bars), generator input tokens per strategy."""
    from longrag.figures import pyplot, save_figure

    plt = pyplot()
    ds, strats = _datasets(summary), _strategies(summary, DENSE_ONLY)
    x = np.arange(len(strats))
    w = 0.8 / max(len(ds), 1)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, d in enumerate(ds):
        f1s = [_cell(summary, DENSE_ONLY, s, d, "f1") or 0.0 for s in strats]
        toks = [_cell(summary, DENSE_ONLY, s, d, "generator_input_tokens") or 0 for s in strats]
        a1.bar(x + i * w - 0.4 + w / 2, f1s, w, label=d)
        a2.bar(x + i * w - 0.4 + w / 2, toks, w, label=d)
    for ax, ylabel in ((a1, "F1"), (a2, "generator input tokens")):
        ax.set_xticks(x, strats)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    a1.set_title("F1 by strategy (Table 3 layout)")
    a2.set_title("generator input tokens (Figure 3)")
    return save_figure(fig, path, dpi=110, title=title)




def load_report(run_dir: str | Path) -> dict[str, Any]:
    """The ``dual_eval.json`` of an earlier run (``run_dir`` or the file itself)."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / "dual_eval.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no dual_eval.json (the --out folder of a dual evaluation)")
    return json.loads(path.read_text())


def write_comparison(baseline: dict[str, Any], report: dict[str, Any], out: str | Path,
                     labels: tuple[str, str] = ("base", "tuned")) -> str:
    """Write ``OUT/comparison.{md,json}`` of two runs; ValueError unless they answered the same
    questions (a comparison over different questions would be meaningless)."""
    if baseline.get("questions") != report.get("questions"):
        raise ValueError(f"the baseline answered other questions: {baseline.get('questions')} vs {report.get('questions')}")
    rows, md = compare_summaries(baseline["summary"], report["summary"], labels)
    head = (f"{labels[0]}: {baseline['config']['llm']['model']} (lora {baseline['config']['llm'].get('lora_path')}); "
            f"{labels[1]}: {report['config']['llm']['model']} (lora {report['config']['llm'].get('lora_path')})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(head + "\n\n" + md + "\n")
    (out / "comparison.json").write_text(json.dumps({"labels": labels, "rows": rows}, indent=2))
    return head + "\n\n" + md
