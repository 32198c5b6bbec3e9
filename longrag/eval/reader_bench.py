"""Reader benchmark: which reader context suits a CPU (full units vs MixPR-compressed, by budget).

The plan, all in process and Ray-free, so it measures the reader and not the cluster:

1. the paragraphs of the evaluated questions are pooled into one corpus (each question's own
   distractors plus everyone else's), linked by title mentions and grouped into long units
   (LongRAG, Jiang et al. 2024, Algorithm 1), chunked, embedded with the bundled encoder and searched
   with exact MaxP: the top ``k`` units of every question are the reader's candidates;
2. every :class:`ReaderSetting` reads them: ``full`` keeps whole top units while they fit the budget
   (the reader's ``truncate`` mode), ``mixpr`` squeezes all candidates into the same budget with
   question-seeded Mixture-of-PageRanks (Alonso & Millidge, 2024) sentence selection;
3. EM / F1 (SQuAD rules), seconds per question, prompt tokens and short-answer fallbacks per setting.

Two settings whose fitted contexts are equal for a question (the candidates fit the budget whole,
so MixPR has nothing to remove) share one read. Settings that differ only in few-shot examples run
back to back, so their first turn comes from the KV cache: compare their turn-2 seconds, not totals. Results are appended to a checkpoint as they come,
so a rerun resumes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

import numpy as np

from longrag.config import EmbeddingConfig, ReaderConfig, UnitConfig
from longrag.mixpr.config import MixPRConfig
from longrag.eval.corpus import pool_examples
from longrag.eval.datasets import QAExample
from longrag.eval.links import build_links
from longrag.eval.metrics import exact_match, f1
from longrag.llm.base import LLM
from longrag.types import Unit

log = logging.getLogger(__name__)

Mode = Literal["full", "mixpr"]
MAX_CANDIDATES = 64


@dataclass(frozen=True)
class ReaderSetting:
    """One reader configuration under test."""

    mode: Mode
    budget: int  # reader.max_context_tokens
    few_shot: int = 0

    @property
    def label(self) -> str:
        return f"{self.mode}@{self.budget // 1024}K fs{self.few_shot}"

    def reader_config(self, base: ReaderConfig) -> ReaderConfig:
        return base.model_copy(update={
            "max_context_tokens": self.budget,
            "few_shot_examples": self.few_shot,
            "compression": "truncate" if self.mode == "full" else "mixpr",
        })


def parse_settings(spec: str) -> list[ReaderSetting]:
    """``"full@2048,mixpr@4096,full@2048/fs8"`` -> settings (``/fsN``: N few-shot examples, default 0)."""
    out: list[ReaderSetting] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        head, _, fs = item.partition("/fs")
        mode, sep, budget = head.partition("@")
        if mode not in ("full", "mixpr") or not sep or not budget.isdigit() or int(budget) < 1:
            raise ValueError(f"setting {item!r} is not MODE@TOKENS[/fsN] with MODE full or mixpr")
        if fs and not fs.isdigit():
            raise ValueError(f"setting {item!r}: /fs needs a number of few-shot examples (0-8)")
        out.append(ReaderSetting(mode, int(budget), int(fs) if fs else 0))  # type: ignore[arg-type]
    if not out:
        raise ValueError("no reader settings given")
    return out


@dataclass
class Candidates:
    """The top units of every question and how they were made."""

    units: dict[str, list[Unit]]  # qid -> units, best first
    stats: dict[str, Any] = field(default_factory=dict)


def retrieve_candidates(
    examples: Sequence[QAExample],
    k: int,
    *,
    min_tokens: int = 0,
    embedding: EmbeddingConfig | None = None,
    units: UnitConfig | None = None,
    links: str = "title_mentions",
    progress: Callable[[str], None] = log.info,
) -> Candidates:
    """Pool the examples' paragraphs, group them into long units, and find each question's top
    units with exact MaxP over the bundled encoder (one process, no Ray): at least ``k``, and more
    (up to ``MAX_CANDIDATES``) until they hold ``min_tokens`` tokens, so that every budget under test
    has more candidates than it can take whole."""
    from longrag.index.chunking import chunk_units
    from longrag.index.embedding import Embedder
    from longrag.index.grouping import make_units_from_config
    from longrag.index.maxp import MaxPIndex
    from longrag.text.tokens import counter_for_model_dir

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    t0 = time.perf_counter()
    pooled = pool_examples(list(examples))
    docs = build_links(pooled.documents, links)
    embedder = Embedder(embedding or EmbeddingConfig())
    counter = counter_for_model_dir(embedder.tokenizer_path)
    unit_list = make_units_from_config(docs, units or UnitConfig(kind="grouped"), counter)
    chunks = chunk_units(unit_list, embedder.max_seq_length - 2, counter)
    progress(f"{len(docs)} documents -> {len(unit_list)} units -> {len(chunks)} chunks; embedding")
    t1 = time.perf_counter()
    vectors = embedder.encode_passages([c.text for c in chunks])
    index = MaxPIndex.build(vectors, [c.chunk_id for c in chunks], [c.unit_id for c in chunks])
    queries = embedder.encode_queries([ex.question for ex in examples])
    hits = index.search(queries, max(k, MAX_CANDIDATES) if min_tokens else k)
    by_id = {u.unit_id: u for u in unit_list}
    out: dict[str, list[Unit]] = {}
    for ex, row in zip(examples, hits):
        ranked = [by_id[h.unit_id] for h in row]
        n = k
        while n < len(ranked) and sum(u.n_tokens for u in ranked[:n]) < min_tokens:
            n += 1
        out[ex.qid] = ranked[:n]
    stats = {"documents": len(docs), "units": len(unit_list), "chunks": len(chunks), "k": k,
             "min_tokens": min_tokens,
             "mean_candidates": round(float(np.mean([len(v) for v in out.values()])), 1),
             "mean_candidate_tokens": round(float(np.mean([sum(u.n_tokens for u in v) for v in out.values()]))),
             "links": links, "embed_s": round(time.perf_counter() - t1, 1),
             "total_s": round(time.perf_counter() - t0, 1)}
    return Candidates(out, stats)


def _context_key(reader: Any, question: str, units: list[Unit], compression: str) -> str:
    fitted = reader.fit(question, units, compression)
    return hashlib.sha256("\x00".join(fitted.blocks).encode()).hexdigest()


async def run_settings(
    llm: LLM,
    examples: Sequence[QAExample],
    candidates: Candidates,
    settings: Sequence[ReaderSetting],
    *,
    base: ReaderConfig | None = None,
    mixpr: MixPRConfig | None = None,
    checkpoint: Path | None = None,
    progress: Callable[[str], None] = log.info,
) -> list[dict[str, Any]]:
    """Read every question under every setting; one row per (setting, question)."""
    from functools import partial

    from longrag.reading.longcontext import compress_units_with_mixpr
    from longrag.reading.reader import LongReader

    base = base or ReaderConfig()
    compressor = partial(compress_units_with_mixpr, cfg=mixpr or MixPRConfig())
    done: dict[tuple[str, str], dict[str, Any]] = {}
    if checkpoint is not None and checkpoint.is_file():
        for line in checkpoint.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                done[(row["setting"], row["qid"])] = row
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line
    readers = [(s, LongReader(llm, s.reader_config(base), compressor=compressor)) for s in settings]
    rows: list[dict[str, Any]] = []
    t_start, n_read = time.perf_counter(), 0
    # Question-major: the settings of one question run back to back, so those that give the model
    # the same context (other few-shot counts; MixPR with nothing to remove) reuse its KV cache or
    # share one read.
    for ex in examples:
        units = candidates.units[ex.qid]
        by_context: dict[tuple[str, int], dict[str, Any]] = {}
        for s, reader in readers:
            key = (s.label, ex.qid)
            if key in done:
                rows.append(done[key])
                continue
            ctx = _context_key(reader, ex.question, units, reader.config.compression)
            shared = by_context.get((ctx, s.few_shot))
            if shared is None:
                res = await reader.read(ex.question, units)
                n_read += 1
                shared = {
                    "answer": res.answer, "long_answer": res.long_answer, "raw_short_answer": res.raw_short_answer,
                    "fallback": res.answer_fallback, "context_tokens": res.context_tokens,
                    "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
                    "seconds": round(res.stages_ms["total"] / 1e3, 3),
                    "long_s": round(res.stages_ms["long_answer"] / 1e3, 3),
                    "short_s": round(res.stages_ms["short_answer"] / 1e3, 3),
                    "truncated": res.truncated, "compressed": res.compressed,
                }
                by_context[(ctx, s.few_shot)] = shared
            row = {"setting": s.label, "mode": s.mode, "budget": s.budget, "few_shot": s.few_shot,
                   "qid": ex.qid, "question": ex.question, "golds": list(ex.answers), **shared,
                   "em": exact_match(shared["answer"], ex.answers), "f1": f1(shared["answer"], ex.answers)}
            rows.append(row)
            if checkpoint is not None:
                checkpoint.parent.mkdir(parents=True, exist_ok=True)
                with open(checkpoint, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        progress(f"{len(rows)}/{len(settings) * len(examples)} rows, {n_read} reads, "
                 f"{time.perf_counter() - t_start:.0f}s")
    return rows


def summarize(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setting: questions, EM, F1 (x100), mean seconds, prompt tokens, context tokens, fallbacks."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["setting"], []).append(r)
    out = []
    for label, rs in by.items():
        out.append({
            "setting": label, "mode": rs[0]["mode"], "budget": rs[0]["budget"], "few_shot": rs[0]["few_shot"],
            "questions": len(rs),
            "em": round(100 * float(np.mean([r["em"] for r in rs])), 1),
            "f1": round(100 * float(np.mean([r["f1"] for r in rs])), 1),
            "s_per_q": round(float(np.mean([r["seconds"] for r in rs])), 2),
            "turn1_s_median": round(float(np.median([r["long_s"] for r in rs])), 2),
            "turn2_s_median": round(float(np.median([r["short_s"] for r in rs])), 2),
            "prompt_tokens": round(float(np.mean([r["prompt_tokens"] for r in rs]))),
            "context_tokens": round(float(np.mean([r["context_tokens"] for r in rs]))),
            "fallbacks": sum(1 for r in rs if r["fallback"]),
        })
    return out


def markdown_table(dataset: str, summary: Sequence[dict[str, Any]]) -> str:
    head = ("| dataset | setting | questions | EM | F1 | s / question | turn 1 / turn 2 s (median) | context tokens "
            "| prompt tokens (2 turns) | answers replaced |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head] + [
        f"| {dataset} | {s['setting']} | {s['questions']} | {s['em']} | {s['f1']} | {s['s_per_q']} | "
        f"{s['turn1_s_median']} / {s['turn2_s_median']} | {s['context_tokens']:,} | {s['prompt_tokens']:,} | "
        f"{s['fallbacks']} |" for s in summary
    ]
    return "\n".join(lines)


def plot_summary(summaries: dict[str, Sequence[dict[str, Any]]], path: Path) -> Path:
    """F1 against seconds per question, one marker per setting and dataset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = {"full": "o", "mixpr": "s"}
    for dataset, summary in summaries.items():
        for s in summary:
            ax.scatter(s["s_per_q"], s["f1"], marker=markers[s["mode"]], s=50)
            ax.annotate(f"{dataset} {s['setting']}", (s["s_per_q"], s["f1"]), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
    ax.set_xlabel("seconds per question (2 turns, CPU)")
    ax.set_ylabel("F1")
    ax.set_title("Reader: full units (o) vs MixPR-compressed (s), by context budget")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report_json(dataset: str, candidates: Candidates, summary: Sequence[dict[str, Any]],
                meta: dict[str, Any]) -> dict[str, Any]:
    return {"dataset": dataset, "retrieval": candidates.stats, "settings": list(summary), **meta}


def setting_dicts(settings: Sequence[ReaderSetting]) -> list[dict[str, Any]]:
    return [asdict(s) | {"label": s.label} for s in settings]
