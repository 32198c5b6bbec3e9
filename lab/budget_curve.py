"""The reader's context budget against answers and time: ``jobs.evaluate`` runs that differ only in
``reader.max_context_tokens``, one curve per dataset (issue 47, ask 3).

    python -m lab.budget_curve reports/budget/hotpotqa-05b-*/run reports/budget/musique-05b-*/run \\
        --out docs/budget-curve.png

Reads each run's ``metrics.json`` (its config says the budget), prints a markdown table (EM, F1, the gold
paragraphs the reader was given, context tokens, seconds per question) and writes a PNG of EM / F1 / reader
paragraph recall and seconds per question against the budget.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from longrag.figures import pyplot, save_figure


def read_run(folder: str | Path) -> dict[str, Any]:
    """One run's figures: dataset, reader model, budget, EM, F1, reader paragraph recall, its ceiling
    (paragraph recall of the units read), context tokens, seconds per question."""
    m = json.loads((Path(folder) / "metrics.json").read_text())
    config = (m.get("config") or {}).get("longrag") or {}
    budget = (config.get("reader") or {}).get("max_context_tokens")
    if budget is None:
        raise ValueError(f"{folder}: the run's config has no reader.max_context_tokens")
    k = m.get("reader_k")
    return {"dataset": m["dataset"], "model": (config.get("llm") or {}).get("model"), "budget": int(budget),
            "n": m["n"], "em": m["qa"]["em"], "f1": m["qa"]["f1"], "rpr": m.get("reader_paragraph_recall"),
            "pr_k": m["retrieval"].get(f"paragraph_recall@{k}"), "tokens": m.get("avg_context_tokens"),
            "s": m.get("reader_s"), "run": str(folder)}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| dataset | reader | budget | questions | EM | F1 | reader paragraph recall | PR@k | context tokens | s / question |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['model']} | {r['budget']:,} | {r['n']} | {100 * r['em']:.1f} | "
                     f"{100 * r['f1']:.1f} | {100 * r['rpr']:.1f} | {100 * r['pr_k']:.1f} | {r['tokens']:.0f} | "
                     f"{r['s']:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str | Path) -> Path:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["dataset"], r["model"])].append(r)
    for (dataset, model), rs in sorted(groups.items()):
        rs.sort(key=lambda r: r["budget"])
        x = [r["budget"] for r in rs]
        for key, style in (("f1", "-o"), ("em", "--s"), ("rpr", ":^")):
            left.plot(x, [100 * r[key] for r in rs], style, label=f"{dataset} {key.upper() if key != 'rpr' else 'reader PR'}")
        right.plot(x, [r["s"] for r in rs], "-o", label=f"{dataset} ({model})")
    for ax, ylabel in ((left, "% of questions / gold paragraphs"), (right, "seconds per question (reader)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["budget"] for r in rows}))
        ax.get_xaxis().set_major_formatter(plt.FuncFormatter(lambda v, _: f"{int(v):,}"))
        ax.set_xlabel("reader context budget (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path, title="The reader's budget: answers and time (packed context, top 2 units)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.budget_curve", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="jobs.evaluate output folders (each with metrics.json)")
    p.add_argument("--out", required=True, help="the PNG to write")
    args = p.parse_args(argv)
    rows = sorted((read_run(r) for r in args.runs), key=lambda r: (r["dataset"], r["model"] or "", r["budget"]))
    print(table(rows))
    print(f"\nwrote {plot(rows, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
