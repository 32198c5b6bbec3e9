"""Fine-tune the dual pipeline's reranker from the bundled MiniLM on paragraph support labels, on CPU.

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Section 4.1 reranks dense candidates with a finer scorer. No reranker
ships as a Python package, so this trains one from (question, paragraph, label) data of the bundled
HotpotQA (``supporting_facts`` titles) and MuSiQue (``is_supporting``) samples, split by question into
train / held-out, and evaluates both orders on the held-out questions: recall@k of the supporting
paragraphs among a question's paragraphs, ranked by the bundled dense encoder (before) and by the
trained reranker (after). Two kinds:

- ``bi-encoder`` (default): the bundled all-MiniLM-L6-v2 sentence encoder fine-tuned with
  sentence-transformers' ``MultipleNegativesRankingLoss`` on (question, supporting paragraph, hard
  negative) triples, the hard negative being the non-supporting paragraph of the same question with
  the highest TF-IDF cosine (``negatives="tfidf"``, free; ``"dense"`` takes the dense encoder's best,
  at the cost of encoding every training paragraph) ("Dense Passage Retrieval for Open-Domain
  Question Answering", Karpukhin et al., 2020, Section 3.2: in-batch plus BM25 hard negatives), one
  positive per question per batch (a second positive would be a false in-batch negative). It starts from the dense order, so a few CPU minutes
  improve it; it reranks the dense candidates by its own cosine.
- ``cross-encoder``: a sentence-transformers ``CrossEncoder`` (``num_labels=1``) initialised from the
  same weights, binary cross-entropy on (question, paragraph) pairs with the same hard negatives. Its
  classification head is new and reads the [CLS] token, which a mean-pooled sentence encoder never
  trained: on CPU (about 1,300 pairs in 80 steps) it stayed at a constant score, see docs/dual-perspective.md.

The step loops are plain PyTorch over the models' own tokenizers (``CrossEncoderTrainer`` /
``SentenceTransformerTrainer`` need ``datasets`` and ``accelerate``, which this project does not
require). The folder written loads with ``CrossEncoder(path)`` or ``SentenceTransformer(path)``
(:func:`longrag.dual.rerank.load_reranker` tells them apart) and holds ``training_report.json``.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from longrag.training.reranker_data import (
    SOURCES,
    RerankPair,
    Triple,
    dense_scorer,
    evaluate_ranking,
    hard_negative_order,
    load_sources,
    make_pairs,
    make_triples,
    sample_negatives,
    split_by_question,
    tfidf_scorer,
)

__all__ = [
    "KINDS",
    "NEGATIVES",
    "DEFAULT_LR",
    "TrainerConfig",
    "TrainingReport",
    "freeze_bottom",
    "next_version_dir",
    "train_reranker",
]

log = logging.getLogger(__name__)

REPORT_FILE = "training_report.json"


Kind = Literal["bi-encoder", "cross-encoder"]
KINDS: tuple[str, ...] = ("bi-encoder", "cross-encoder")
Negatives = Literal["tfidf", "dense", "random"]
NEGATIVES: tuple[str, ...] = ("tfidf", "dense", "random")
#: Learning rate of the encoder body per kind when ``TrainerConfig.learning_rate`` is None.
DEFAULT_LR: dict[str, float] = {"bi-encoder": 3e-5, "cross-encoder": 7e-5}


@dataclass
class TrainerConfig:
    """What a training run does; saved in the report."""

    kind: Kind = "bi-encoder"
    sources: tuple[str, ...] = ("hotpotqa", "musique")
    limit_per_source: int | None = None
    heldout_fraction: float = 0.2
    max_steps: int = 30
    batch_size: int = 16
    learning_rate: float | None = None
    head_learning_rate: float = 2e-3
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_length: int = 128
    negatives: Negatives = "tfidf"
    balance_positives: bool = True
    negatives_per_positive: int | None = 2
    scale: float = 20.0
    freeze_layers: int = 3
    eval_k: tuple[int, ...] = (2, 5)
    seed: int = 0
    torch_threads: int | None = None

    @property
    def lr(self) -> float:
        return DEFAULT_LR[self.kind] if self.learning_rate is None else self.learning_rate

    def check(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown reranker kind {self.kind!r}; valid: {list(KINDS)}")
        if self.negatives not in NEGATIVES:
            raise ValueError(f"unknown negatives {self.negatives!r}; valid: {list(NEGATIVES)}")
        bad = [s for s in self.sources if s not in SOURCES]
        if bad or not self.sources:
            raise ValueError(f"unknown training sources {bad or list(self.sources)!r}; valid: {sorted(SOURCES)}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        for name in ("max_steps", "batch_size", "max_length"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0 or None, got {self.learning_rate!r}")
        if self.negatives_per_positive is not None and self.negatives_per_positive <= 0:
            raise ValueError(f"negatives_per_positive must be a positive int or None, got {self.negatives_per_positive!r}")
        if not isinstance(self.freeze_layers, int) or self.freeze_layers < 0:
            raise ValueError(f"freeze_layers must be an int >= 0, got {self.freeze_layers!r}")
        if not self.eval_k or any(k <= 0 for k in self.eval_k):
            raise ValueError(f"eval_k must be positive ints, got {self.eval_k!r}")


@dataclass
class TrainingReport:
    version: str
    output_dir: str
    base_model: str
    config: dict[str, Any]
    data: dict[str, Any]
    counts: dict[str, int]
    loss: dict[str, Any]
    heldout: dict[str, Any]
    seconds: dict[str, float]
    created_utc: str
    notes: list[str] = field(default_factory=list)
    kind: str = "cross-encoder"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -------------------------------------------------------------------------------------------- output


def next_version_dir(root: str | Path, prefix: str = "minilm-reranker") -> Path:
    """``root/{prefix}-v{N}`` with N one more than the highest existing version (from 1)."""
    root = Path(root)
    pat = re.compile(rf"^{re.escape(prefix)}-v(\d+)$")
    existing = [int(m.group(1)) for p in (root.iterdir() if root.is_dir() else []) if (m := pat.match(p.name))]
    return root / f"{prefix}-v{max(existing, default=0) + 1}"


# -------------------------------------------------------------------------------------------- training


def freeze_bottom(model: Any, layers: int) -> int:
    """Freeze the token embeddings and the first ``layers`` transformer layers (their backward pass
    is skipped: a CPU step costs about half); returns the number of frozen parameters."""
    if layers <= 0:
        return 0
    frozen = 0
    pat = re.compile(r"(^|\.)(embeddings\.|encoder\.layer\.(\d+)\.)")
    for name, p in model.named_parameters():
        m = pat.search(name)
        if m and (m.group(3) is None or int(m.group(3)) < layers):
            p.requires_grad_(False)
            frozen += p.numel()
    return frozen


def _optimizer(torch: Any, model: Any, cfg: TrainerConfig, head_prefix: str | None = None) -> Any:
    """AdamW with weight decay off for biases and LayerNorms; a new head (``head_prefix``) gets its own,
    larger learning rate."""
    no_decay = ("bias", "LayerNorm.weight", "LayerNorm.bias")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    is_head = (lambda n: n.startswith(head_prefix)) if head_prefix else (lambda n: False)
    body = [(n, p) for n, p in named if not is_head(n)]
    groups = [
        {"params": [p for n, p in body if not any(nd in n for nd in no_decay)], "weight_decay": cfg.weight_decay},
        {"params": [p for n, p in body if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    head = [p for n, p in named if is_head(n)]
    if head:
        groups.append({"params": head, "weight_decay": 0.0, "lr": cfg.head_learning_rate})
    return torch.optim.AdamW(groups, lr=cfg.lr)


def _steps(
    torch: Any, model: Any, opt: Any, cfg: TrainerConfig, batches: Sequence[Any], loss_of: Callable[[Any], Any], bar: Any
) -> list[float]:
    """``cfg.max_steps`` optimiser steps over ``batches`` (cycled), warmup then linear decay."""
    from transformers import get_linear_schedule_with_warmup

    sched = get_linear_schedule_with_warmup(opt, math.ceil(cfg.warmup_ratio * cfg.max_steps), cfg.max_steps)
    losses: list[float] = []
    model.train()
    for step in range(cfg.max_steps):
        loss = loss_of(batches[step % len(batches)])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        bar.update(1)
    model.eval()
    return losses


def _train_bi_encoder(torch: Any, base: str, cfg: TrainerConfig, train_ex: Any, negatives: Any, bar: Any):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    st = SentenceTransformer(base, device="cpu", local_files_only=True)
    eval_len = st.max_seq_length
    st.max_seq_length = min(cfg.max_length, eval_len or cfg.max_length)
    n_q = max(1, sum(1 for k in negatives.values() if k))
    rounds = max(1, math.ceil(cfg.max_steps * cfg.batch_size / n_q))
    batches: list[list[Triple]] = []
    for rnd in make_triples(train_ex, negatives, rounds, cfg.seed):  # batches never straddle rounds
        batches += [rnd[i : i + cfg.batch_size] for i in range(0, len(rnd), cfg.batch_size) if len(rnd[i : i + cfg.batch_size]) > 1]
    if not batches:
        raise ValueError("no training triples (questions need a supporting and a non-supporting paragraph)")
    loss_fn = MultipleNegativesRankingLoss(st, scale=cfg.scale)

    def loss_of(batch: list[Triple]) -> Any:
        cols = ([t.question for t in batch], [t.positive for t in batch], [t.negative for t in batch])
        return loss_fn([st.tokenize(list(c)) for c in cols], None)

    frozen = freeze_bottom(st, cfg.freeze_layers)
    losses = _steps(torch, st, _optimizer(torch, st, cfg), cfg, batches, loss_of, bar)
    st.max_seq_length = eval_len

    def score(question: str, texts: list[str]) -> list[float]:
        q = st.encode([question], normalize_embeddings=True, show_progress_bar=False, convert_to_numpy=True)
        p = st.encode(texts, normalize_embeddings=True, show_progress_bar=False, convert_to_numpy=True, batch_size=32)
        return [float(x) for x in (p @ q.reshape(-1))]

    seen = sum(len(b) for b in (batches[i % len(batches)] for i in range(len(losses))))
    counts = {"train_triples": sum(len(b) for b in batches), "examples_seen": seen, "frozen_parameters": frozen,
              "loss": "MultipleNegativesRankingLoss (in-batch + one hard negative per question)"}  # fmt: skip
    return st, losses, counts, score


def _train_cross_encoder(torch: Any, base: str, cfg: TrainerConfig, train_ex: Any, negatives: Any, bar: Any):
    from sentence_transformers import CrossEncoder

    all_pairs = make_pairs(train_ex)
    rank = {(k, t): i for k, ts in negatives.items() for i, t in enumerate(ts)}
    hardness = (lambda p: -rank.get((p.qid, p.text), 10**6)) if cfg.negatives != "random" else None
    pairs = sample_negatives(all_pairs, cfg.negatives_per_positive, cfg.seed, hardness)
    if not pairs or not any(p.label > 0 for p in pairs):
        raise ValueError(f"no training pairs with a positive label from sources {list(cfg.sources)}")
    n_pos = sum(1 for p in pairs if p.label > 0)
    n_neg = len(pairs) - n_pos
    ce = CrossEncoder(base, num_labels=1, max_length=cfg.max_length, device="cpu", local_files_only=True)
    model, tok = ce.transformers_model, ce.tokenizer
    pos_weight = torch.tensor(n_neg / max(n_pos, 1)) if cfg.balance_positives else None
    bce = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    rng = random.Random(cfg.seed)
    order: list[int] = []
    while len(order) < cfg.max_steps * cfg.batch_size:  # epochs, each reshuffled
        more = list(range(len(pairs)))
        rng.shuffle(more)
        order.extend(more)
    batches = [[pairs[i] for i in order[s * cfg.batch_size : (s + 1) * cfg.batch_size]] for s in range(cfg.max_steps)]

    def loss_of(batch: list[RerankPair]) -> Any:
        enc = tok([p.question for p in batch], [p.text for p in batch], padding=True, truncation="longest_first",
                  max_length=cfg.max_length, return_tensors="pt")  # fmt: skip
        return bce(model(**enc).logits.view(-1), torch.tensor([p.label for p in batch], dtype=torch.float32))

    frozen = freeze_bottom(model, cfg.freeze_layers)
    losses = _steps(torch, model, _optimizer(torch, model, cfg, head_prefix="classifier."), cfg, batches, loss_of, bar)

    def score(question: str, texts: list[str]) -> list[float]:
        s = ce.predict([(question, t) for t in texts], batch_size=32, show_progress_bar=False, convert_to_numpy=True)
        return [float(x) for x in np.asarray(s).reshape(-1)]

    counts = {"train_pairs_available": len(all_pairs), "train_pairs": len(pairs), "train_positive_pairs": n_pos,
              "train_negative_pairs": n_neg, "examples_seen": cfg.max_steps * cfg.batch_size, "frozen_parameters": frozen,
              "loss": "binary cross-entropy on logits"
              + (", positives weighted by negatives/positives" if pos_weight is not None else "")}  # fmt: skip
    return ce, losses, counts, score


def train_reranker(
    out_root: str | Path,
    cfg: TrainerConfig | None = None,
    *,
    base_model: str | Path | None = None,
    encoder: Any = None,
    progress_bar: bool = False,
    prefix: str = "minilm-reranker",
) -> TrainingReport:
    """Train, evaluate before/after on held-out questions, write ``out_root/{prefix}-vN``; returns the
    report (also in the folder's ``training_report.json``). ``encoder`` ranks the "before" order and
    picks the hard negatives (default: the bundled dense MiniLM)."""
    cfg = cfg or TrainerConfig()
    cfg.check()
    import torch

    from longrag.index.embedding import bundled_minilm_path
    from longrag.progress import progress

    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    t_start = time.perf_counter()
    examples, provenance = load_sources(cfg.sources, cfg.limit_per_source)
    train_ex, held_ex = split_by_question(examples, cfg.heldout_fraction, cfg.seed)
    base = str(base_model or bundled_minilm_path())
    if encoder is None:
        from longrag.config import EmbeddingConfig
        from longrag.index.embedding import Embedder

        encoder = Embedder(EmbeddingConfig(device="cpu"))
    dense = dense_scorer(encoder)
    t0 = time.perf_counter()
    before = evaluate_ranking(held_ex, dense, cfg.eval_k)
    t_before = time.perf_counter() - t0
    t0 = time.perf_counter()
    hard = {"dense": dense, "tfidf": tfidf_scorer(), "random": None}[cfg.negatives]
    negatives = hard_negative_order(train_ex, hard)
    if cfg.negatives == "random":  # a seeded shuffle instead of the file order
        rng_neg = random.Random(cfg.seed)
        negatives = {k: rng_neg.sample(v, len(v)) for k, v in negatives.items()}
    t_neg = time.perf_counter() - t0

    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    train = _train_bi_encoder if cfg.kind == "bi-encoder" else _train_cross_encoder
    bar = progress(cfg.max_steps, "reranker steps", bar=progress_bar, logger=log, unit="step", interval_s=15.0)
    t0 = time.perf_counter()
    try:
        model, losses, counts, score = train(torch, base, cfg, train_ex, negatives, bar)
    finally:
        bar.close()
    t_train = time.perf_counter() - t0

    t0 = time.perf_counter()
    after = evaluate_ranking(held_ex, score, cfg.eval_k)
    t_after = time.perf_counter() - t0

    better = {k: after[k] > before[k] for k in before}
    loss_note = counts.pop("loss")
    notes = [
        f"before = the bundled dense MiniLM bi-encoder's order; after = this {cfg.kind}'s order",
        f"loss: {loss_note}",
        "negatives: " + {
            "dense": "the dense encoder's best-scored non-supporting paragraphs of the question (hard)",
            "tfidf": "the question's non-supporting paragraphs with the highest TF-IDF cosine (hard, lexical)",
            "random": "random non-supporting paragraphs of the question",
        }[cfg.negatives],
    ]  # fmt: skip
    if not all(better.values()):
        notes.append(
            "WARNING: the reranker does not beat the dense order on held-out questions at every k: do not point "
            "dual.reranker at it; train longer (more --max-steps) or on more data"
        )
        log.warning(notes[-1] + " (before %s, after %s)", before, after)
    out_dir = next_version_dir(out_root, prefix)
    out_dir.mkdir(parents=True, exist_ok=False)
    (model.save_pretrained if cfg.kind == "cross-encoder" else model.save)(str(out_dir))
    window = max(1, min(20, len(losses) // 5))
    report = TrainingReport(
        version=out_dir.name,
        output_dir=str(out_dir),
        base_model="all-MiniLM-L6-v2 (bundled)" if base_model is None else str(base_model),
        config={k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()} | {"lr_used": cfg.lr},
        data={"sources": provenance, "split": "by question id (sha256 bucket with the seed)"},
        counts={"train_questions": len(train_ex), "heldout_questions": len(held_ex), "steps": len(losses), **counts},
        loss={
            "first": round(float(np.mean(losses[:window])), 4),
            "last": round(float(np.mean(losses[-window:])), 4),
            "window_steps": window,
            "every_10_steps": [round(x, 4) for x in losses[::10]],
        },
        heldout={
            "dense_before": before,
            "reranker_after": after,
            "better_than_dense": better,
            "candidates": "each question's own paragraphs",
        },
        seconds={
            "eval_before": round(t_before, 1),
            "hard_negatives": round(t_neg, 1),
            "train": round(t_train, 1),
            "eval_after": round(t_after, 1),
            "total": round(time.perf_counter() - t_start, 1),
        },
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        notes=notes,
        kind=cfg.kind,
    )
    (out_dir / REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=2))
    return report
