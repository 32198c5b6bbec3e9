"""Run directories of the evaluate job: write one setting or a combination, read one back, combine.

A run directory holds ``metrics.json`` (the flat metrics of the setting(s) merged with the report's
summary, config and provenance), ``predictions.jsonl``, ``report.md`` (with the paper-style table)
and PNG plots. Ray-free: ``jobs.evaluate`` and offline tooling (``--combine``) share it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from longrag.eval import pipeline as P
from longrag.eval.report import write_report


def tables_md(runs: list[dict[str, Any]], title: str) -> str:
    parts = [f"## {title}", "", P.paper_table(runs), ""]
    qa = P.qa_table(runs)
    if qa:
        parts += ["### Reader", "", qa, ""]
    parts += [
        "R@k: all gold documents among the documents of the top k units; AR@k: a gold answer occurs in the "
        "text of the top k units (HotpotQA: bridge questions only, as in LongRAG, Jiang et al., 2024, "
        "Section 4.2). Tokens are counted with the "
        "embedding model's tokenizer (unit sizes) and the reader model's tokenizer (reader context).",
        "",
    ]
    return "\n".join(parts)


def write_run(
    out: Path,
    results: list[dict[str, Any]],
    flat: dict[str, Any] | list[dict[str, Any]],
    config: dict[str, Any],
    provenance: dict[str, Any],
    extra: dict[str, Any],
    title: str,
) -> dict[str, str]:
    """Write the report files for one setting (``flat`` a dict) or a combination (a list)."""
    paths = write_report(out, results, config, provenance, title=title)
    doc = json.loads(Path(paths["metrics"]).read_text())
    runs = flat if isinstance(flat, list) else [flat]
    if isinstance(flat, list):
        head = {"dataset": runs[0]["dataset"], "n": max(r["n"] for r in runs), "runs": runs}
    else:
        head = dict(flat)
    Path(paths["metrics"]).write_text(json.dumps({**head, **doc, **extra}, indent=2, default=str))
    report = Path(paths["report"]).read_text()
    marker = "## Config"
    table = tables_md(runs, "Paper-style table (LongRAG, Jiang et al., 2024, Tables 1-2)")
    report = report.replace(marker, table + "\n" + marker, 1) if marker in report else report + "\n" + table
    Path(paths["report"]).write_text(report)
    return paths


def read_run(run_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(results, flat metrics of its settings, metrics doc) of a run directory written earlier."""
    d = Path(run_dir)
    doc = json.loads((d / "metrics.json").read_text())
    with open(d / "predictions.jsonl", encoding="utf-8") as fh:
        results = [P.curves_from_json(json.loads(line)) for line in fh if line.strip()]
    flats = doc["runs"] if "runs" in doc else [{k: doc[k] for k in doc if k not in ("summary", "config", "provenance", "plots")}]
    return results, flats, doc


def combine(run_dirs: Sequence[str], out: str, command: list[str]) -> dict[str, str]:
    """One combined report from run directories of one dataset (each setting keeps its label)."""
    results: list[dict[str, Any]] = []
    flats: list[dict[str, Any]] = []
    configs: dict[str, Any] = {}
    datasets = set()
    for d in run_dirs:
        res, fl, doc = read_run(d)
        results += res
        flats += fl
        configs[str(d)] = doc.get("config")
        datasets.update(f["dataset"] for f in fl)
    if len(datasets) > 1:
        raise ValueError(f"runs of different datasets cannot be combined: {sorted(datasets)}")
    labels = [f.get("label") or f.get("unit") for f in flats]
    if len(set(labels)) != len(labels):
        raise ValueError(f"runs share setting labels {labels}: a combined curve would mix them")
    from longrag.index.manifest import collect_provenance

    prov = {**collect_provenance(command).model_dump(), "combined_from": [str(d) for d in run_dirs]}
    return write_run(Path(out), results, flats, {"runs": configs}, prov, {}, f"{flats[0]['dataset']}: combined runs")
