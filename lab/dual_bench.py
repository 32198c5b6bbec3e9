"""Dual-perspective LongRAG in the paper's LongBench setting: Table 3 (F1 per strategy), the
generator's input tokens (Figure 3) and the reranker's effect, on the bundled QA samples.

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Section 5.3 and Table 3: every question comes with its own long
context (here the question's own paragraphs: the supporting ones and the distractors), which is
chunked, retrieved (dense, optionally reranked) and answered by each strategy R&B, R&L, Ext, Fil
and E&F. Per question the strategies share one retrieval, and the extractor and the filter run once
for all strategies that use them (E&F = Ext's global information + Fil's kept chunks:
:meth:`longrag.dual.pipeline.DualPipeline.run_many`); only the generator runs per strategy.

Questions are by default the held-out part of the reranker's training split
(:func:`longrag.training.reranker_data.split_by_question`, same fraction and seed), so a reranker from
``python -m jobs.train_reranker`` is measured on questions it did not train on. Rows are appended to
a checkpoint as each question finishes (:class:`longrag.eval.checkpoint.ReaderCheckpoint`), so a
rerun resumes. Answers are scored with the SQuAD / HotpotQA F1 (:func:`longrag.eval.metrics.f1`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab.dual_report import (
    DATASETS,
    RERANKED,
    nan_mean,
    plot_table3,
    reranker_markdown,
    summarize,
    table3_markdown,
    tokens_markdown,
)
from longrag.config import DUAL_STRATEGIES, DualConfig, EmbeddingConfig, LLMConfig
from longrag.data import data_path
from longrag.dual.chunking import SourceParagraph
from longrag.dual.paragraphs import index_paragraphs
from longrag.dual.pipeline import DualPipeline
from longrag.dual.records import DualResult
from longrag.dual.rerank import DENSE_ONLY, ChunkRetrieval, DenseEncoder, PairScorer
from longrag.eval.checkpoint import ReaderCheckpoint
from longrag.eval.datasets import QAExample, load_qa
from longrag.eval.metrics import exact_match, f1
from longrag.llm.base import LLM

__all__ = [
    "DATASETS",
    "DualEvalConfig",
    "select_questions",
    "question_paragraphs",
    "support_recall",
    "run_dual_eval",
    "checkpoint_rows",
    "retrieval_effect",
    "run_and_report",
]

log = logging.getLogger(__name__)



class DualEvalConfig(BaseModel):
    """What a dual-perspective evaluation runs; saved with its report."""

    model_config = ConfigDict(extra="forbid")

    datasets: tuple[str, ...] = Field(("musique", "hotpotqa"), description="Bundled datasets (Table 3 columns).")
    strategies: tuple[str, ...] = Field(DUAL_STRATEGIES, description="Strategies (Table 3 rows).")
    limit: int = Field(10, gt=0, description="Questions per dataset.")
    start: int = Field(0, ge=0, description="Skip this many selected questions first (split a run across processes).")
    questions: Literal["heldout", "first"] = Field(
        "heldout", description="heldout: the reranker split's held-out questions; first: the file's first ones."
    )
    heldout_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Same as jobs.train_reranker's.")
    seed: int = Field(0, description="Same as jobs.train_reranker's.")
    reranked_strategies: tuple[str, ...] = Field(
        ("R&B",), description="Strategies also answered over the reranked chunks (needs dual.reranker)."
    )
    exclude_qids: tuple[str, ...] = Field(
        (), description="Questions left out before the selection (e.g. those a fine-tuned model trained on)."
    )
    dual: DualConfig = Field(default_factory=DualConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    embedding: EmbeddingConfig = Field(default_factory=lambda: EmbeddingConfig(device="cpu"))

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [d for d in v if d not in DATASETS]
        if bad or not v:
            raise ValueError(f"unknown datasets {bad or list(v)!r}; valid: {sorted(DATASETS)}")
        return tuple(dict.fromkeys(v))

    @field_validator("strategies", "reranked_strategies")
    @classmethod
    def _strategies(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [s for s in v if s not in DUAL_STRATEGIES]
        if bad:
            raise ValueError(f"unknown strategies {bad!r}; valid: {', '.join(DUAL_STRATEGIES)}")
        return tuple(dict.fromkeys(v))


# -------------------------------------------------------------------------------------------- data


def select_questions(dataset: str, cfg: DualEvalConfig, path: str | Path | None = None) -> list[QAExample]:
    """The ``cfg.limit`` questions of ``dataset`` with paragraphs and support labels, after the first
    ``cfg.start``: of the reranker split's held-out part (``questions="heldout"``) or of the file."""
    from longrag.training.reranker_data import split_by_question

    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; valid: {sorted(DATASETS)}")
    loaded = load_qa(path or data_path(DATASETS[dataset]), dataset)  # type: ignore[arg-type]
    usable = [ex for ex in loaded.examples if ex.paragraphs and any(p.is_supporting for p in ex.paragraphs)]
    if cfg.questions == "heldout":
        _, held = split_by_question([(dataset, ex) for ex in usable], cfg.heldout_fraction, cfg.seed)
        usable = [ex for _, ex in held]
    if cfg.exclude_qids:
        excluded = set(cfg.exclude_qids)
        usable = [ex for ex in usable if ex.qid not in excluded]
    return usable[cfg.start : cfg.start + cfg.limit]


def question_paragraphs(ex: QAExample) -> tuple[list[SourceParagraph], set[str]]:
    """The question's own paragraphs as the long context (ids ``qid/i``) and the supporting ids."""
    paras = [SourceParagraph(f"{ex.qid}/{i}", p.text, p.title) for i, p in enumerate(ex.paragraphs)]
    support = {sp.id for sp, p in zip(paras, ex.paragraphs) if p.is_supporting}
    return paras, support


def support_recall(retrieval: ChunkRetrieval, support: set[str]) -> float:
    """Share of the supporting paragraphs that at least one retrieved chunk comes from."""
    if not support:
        return float("nan")
    found = {c.chunk.paragraph_id for c in retrieval.chunks}
    return len(found & support) / len(support)


# -------------------------------------------------------------------------------------------- run


def _row(dataset: str, ex: QAExample, retrieval_label: str, recall: float, res: DualResult,
         support: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    stages = {st.stage: st for st in res.stages}
    from_support = {c.chunk.chunk_id for c in res.retrieved if c.chunk.paragraph_id in support}
    return {
        "dataset": dataset,
        "qid": ex.qid,
        "question": ex.question,
        "golds": list(ex.answers),
        "strategy": res.strategy,
        "retrieval": retrieval_label,
        "answer": res.answer,
        "em": exact_match(res.answer, ex.answers),
        "f1": f1(res.answer, ex.answers),
        "support_recall": recall,
        "generator_input_tokens": res.generator_input_tokens,
        "llm_calls": sum(st.calls for st in res.stages),
        "prompt_tokens": sum(st.prompt_tokens for st in res.stages),
        "completion_tokens": sum(st.completion_tokens for st in res.stages),
        "stage_ms": {name: st.wall_ms for name, st in stages.items()},
        "retrieved": len(res.retrieved),
        "kept": len(res.kept_chunk_ids),
        # The filter judged against the support labels: chunks from supporting paragraphs among
        # those retrieved and among those kept.
        "retrieved_supporting": len(from_support),
        "kept_supporting": len(from_support & set(res.kept_chunk_ids)),
        "notes": [n for st in res.stages for n in st.notes] + res.notes,
    }


def setup_of(cfg: DualEvalConfig) -> dict[str, Any]:
    """What decides a row's answer besides its question and strategy (the checkpoint's setup). The
    reranker is in the reranked rows' keys instead, so adding one later reuses the dense rows."""
    return {
        "llm": cfg.llm.model_dump(),
        "dual": cfg.dual.model_dump(exclude={"strategy", "reranker", "extractor_llm", "filter_llm", "generator_llm"}),
        "embedding": cfg.embedding.model_dump(),
    }


async def run_dual_eval(
    cfg: DualEvalConfig,
    llm: LLM,
    encoder: DenseEncoder,
    scorer: PairScorer | None = None,
    *,
    checkpoint: str | Path | None = None,
    examples: dict[str, list[QAExample]] | None = None,
    progress: Callable[[str], None] = log.info,
) -> list[dict[str, Any]]:
    """Answer every selected question with every strategy; one row per (dataset, question,
    strategy, retrieval). Question-major, datasets interleaved: a question's strategies share its
    index, retrieval, extraction and filter. With ``scorer``, ``cfg.reranked_strategies`` are also answered over the
    reranked chunks (retrieval ``"reranked"``) and every row records the support recall of its
    chunks. ``examples`` overrides :func:`select_questions` (tests)."""
    if examples is None:
        examples = {d: select_questions(d, cfg) for d in cfg.datasets}
    ckpt = ReaderCheckpoint(checkpoint, setup_of(cfg)) if checkpoint is not None else None
    pipe = DualPipeline(llm, cfg.dual)
    plan: list[tuple[str, Any, tuple[str, ...]]] = [(DENSE_ONLY, None, cfg.strategies)]
    if scorer is not None and cfg.reranked_strategies:
        plan.append((RERANKED, scorer, cfg.reranked_strategies))
    total = sum(len(v) for v in examples.values()) * sum(len(s) for _, _, s in plan)
    rows: list[dict[str, Any]] = []
    t_start, n_new = time.perf_counter(), 0
    # Datasets interleaved (1st of each, then 2nd of each, ...): a run cut short covers all of them.
    order = [(d, exs[i]) for i in range(max(map(len, examples.values()), default=0))
             for d, exs in examples.items() if i < len(exs)]  # fmt: skip
    for dataset, ex in order:
        paras, support = question_paragraphs(ex)
        index = None
        for label, sc, strategies in plan:
            keys = {s: [dataset, s, label if sc is None else f"{label}:{sc.name}"] for s in strategies}
            cached = {s: ckpt.get(ex.qid, ex.question, keys[s]) for s in strategies} if ckpt else {}
            missing = [s for s in strategies if cached.get(s) is None]
            if missing:
                if index is None:
                    index = index_paragraphs(paras, encoder, None, cfg.dual)
                retrieval = index.retriever.retrieve(ex.question, scorer=sc)
                recall = support_recall(retrieval, support)
                results = await pipe.run_many(ex.question, retrieval, index.paragraphs, missing)
                for s in missing:
                    row = _row(dataset, ex, label, recall, results[s], support)
                    cached[s] = row
                    n_new += 1
                    if ckpt:
                        ckpt.add(ex.qid, ex.question, keys[s], row)
            rows.extend(cached[s] for s in strategies)  # type: ignore[misc]
        progress(f"{len(rows)}/{total} rows ({n_new} answered now), {time.perf_counter() - t_start:.0f}s")
    return rows


def retrieval_effect(
    cfg: DualEvalConfig, encoder: DenseEncoder, scorer: PairScorer, examples: dict[str, list[QAExample]] | None = None,
    ks: Sequence[int] = (2, 7),
) -> list[dict[str, Any]]:
    """The reranker's effect without the LLM: per dataset and k, the mean support recall (x100) of
    the top-k chunks in dense order and reranked, over the same questions as the strategies."""
    if examples is None:
        examples = {d: select_questions(d, cfg) for d in cfg.datasets}
    out = []
    for dataset, exs in examples.items():
        rec: dict[tuple[str, int], list[float]] = {}
        for ex in exs:
            paras, support = question_paragraphs(ex)
            index = index_paragraphs(paras, encoder, None, cfg.dual)
            for label, sc in ((DENSE_ONLY, None), (RERANKED, scorer)):
                for k in ks:
                    r = index.retriever.retrieve(ex.question, k=k, scorer=sc)
                    rec.setdefault((label, k), []).append(support_recall(r, support))
        for k in ks:
            out.append({"dataset": dataset, "k": k, "questions": len(exs), "reranker": scorer.name,
                        "dense_recall": round(100 * nan_mean(rec[(DENSE_ONLY, k)]), 1),
                        "reranked_recall": round(100 * nan_mean(rec[(RERANKED, k)]), 1)})  # fmt: skip
    return out


def checkpoint_rows(checkpoint: str | Path) -> list[dict[str, Any]]:
    """The rows a (possibly unfinished) run has appended to its checkpoint, in file order."""
    return list(ReaderCheckpoint(checkpoint, {}).entries.values())


# -------------------------------------------------------------------------------------------- run + write


CHECKPOINT = ".dual-checkpoint.jsonl"


def run_and_report(
    cfg: DualEvalConfig,
    out: str | Path,
    *,
    plot: str | Path | None = None,
    report_only: bool = False,
    torch_threads: int = 2,
    command: Sequence[str] = (),
    data: dict[str, str | Path | None] | None = None,
) -> dict[str, Any]:
    """Run (or, with ``report_only``, only report the checkpointed rows of) an evaluation and write
    ``OUT/dual_eval.json``, ``OUT/rows.jsonl``, ``OUT/table3.md`` and the plot (default
    ``OUT/dual_table3.png``); returns the report with ``markdown``. The bundled encoder, the
    configured LLM and ``dual.reranker`` (when set) are loaded here. Raises ValueError /
    FileNotFoundError on a bad reranker folder or an empty checkpoint. ``data``: a QA file per
    dataset instead of the bundled sample."""
    import asyncio

    import torch

    from longrag.dual.rerank import load_reranker
    from longrag.index.embedding import Embedder
    from longrag.llm.factory import build_llm

    torch.set_num_threads(torch_threads)
    out = Path(out)
    scorer = load_reranker(cfg.dual.reranker) if cfg.dual.reranker else None
    t0 = time.perf_counter()
    encoders: list[Embedder] = []

    def encoder() -> Embedder:  # built once, and only when needed
        if not encoders:
            encoders.append(Embedder(cfg.embedding))
        return encoders[0]

    if report_only:
        rows = checkpoint_rows(out / CHECKPOINT)
        if not rows:
            raise ValueError(f"no rows in {out / CHECKPOINT}: nothing to report")
    else:
        llm = build_llm(cfg.llm)
        try:
            examples = {d: select_questions(d, cfg, (data or {}).get(d)) for d in cfg.datasets}
            rows = asyncio.run(run_dual_eval(cfg, llm, encoder(), scorer, checkpoint=out / CHECKPOINT,
                                             examples=examples))  # fmt: skip
        finally:
            asyncio.run(llm.aclose())
    summary = summarize(rows)
    effect = retrieval_effect(cfg, encoder(), scorer) if scorer is not None else []
    md = [table3_markdown(summary), "", tokens_markdown(summary)]
    if any(s["retrieval"] == RERANKED for s in summary):
        md += ["", reranker_markdown(summary)]
    if effect:
        md += ["", "| dataset | k | questions | support recall dense | reranked |", "| --- | --- | --- | --- | --- |"]
        md += [f"| {e['dataset']} | {e['k']} | {e['questions']} | {e['dense_recall']} | {e['reranked_recall']} |"
               for e in effect]  # fmt: skip
    report = {
        "config": cfg.model_dump(mode="json"),
        "summary": summary,
        "retrieval_effect": effect,
        "questions": {d: sorted({r["qid"] for r in rows if r["dataset"] == d}) for d in cfg.datasets},
        "wall_s": round(time.perf_counter() - t0, 1),
        "command": list(command),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "dual_eval.json").write_text(json.dumps(report, indent=2))
    with open(out / "rows.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    (out / "table3.md").write_text("\n".join(md) + "\n")
    plot_table3(summary, plot or out / "dual_table3.png",
                title=f"{cfg.llm.model}, dense only, {cfg.dual.chunk_words} words x k={cfg.dual.rerank_k}")  # fmt: skip
    return report | {"markdown": "\n".join(md)}
