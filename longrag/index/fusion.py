"""Reciprocal-rank fusion of ranked unit lists (``retrieval.mode=hybrid``: dense MaxP and BM25).

A unit's fused score is ``sum_i w_i / (c + rank_i)`` over the lists it appears in (rank from 1;
Cormack, Clarke and Buettcher, 2009, with their ``c = 60``), ties broken by ``unit_id``. Ranks, not
scores, are fused, so a cosine and a BM25 score need no common scale. Each list is the global top
``depth`` of its signal, merged over the shards first (:func:`longrag.index.maxp.merge_topk`), so
the fused ranking is the same for any number of shards.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from longrag.types import UnitHit

if TYPE_CHECKING:
    from longrag.config import RetrievalConfig

__all__ = ["Fusion", "fuse", "merge_answers", "merge_shards", "rrf_scores"]


@dataclass(frozen=True)
class Fusion:
    """How the lexical list joins the dense one (``retrieval.hybrid_*``)."""

    lexical_weight: float = 0.5
    depth: int = 50
    c: int = 60

    @classmethod
    def of(cls, retrieval: RetrievalConfig) -> Fusion:
        """The settings of a ``retrieval`` config section."""
        return cls(lexical_weight=retrieval.hybrid_weight, depth=retrieval.hybrid_depth, c=retrieval.rrf_c)

    def __post_init__(self) -> None:
        if self.lexical_weight < 0:
            raise ValueError(f"lexical_weight must be >= 0, got {self.lexical_weight}")
        if self.depth < 1 or self.c < 0:
            raise ValueError(f"depth must be >= 1 and c >= 0, got depth={self.depth}, c={self.c}")


def rrf_scores(rankings: Sequence[Sequence[Hashable]], weights: Sequence[float], c: int = 60) -> dict[Hashable, float]:
    """``{item: sum of weight / (c + rank)}`` over ``rankings`` (each best first, items unique within one)."""
    if len(rankings) != len(weights):
        raise ValueError(f"{len(rankings)} rankings for {len(weights)} weights")
    out: dict[Hashable, float] = {}
    for ranking, w in zip(rankings, weights):
        for rank, item in enumerate(ranking, start=1):
            out[item] = out.get(item, 0.0) + w / (c + rank)
    return out


def fuse(dense: Sequence[UnitHit], lexical: Sequence[UnitHit], k: int, fusion: Fusion = Fusion()) -> list[UnitHit]:
    """The top ``k`` units of both lists by reciprocal rank: each hit keeps its dense best chunk
    (the lexical one when only BM25 found it), takes the fused score, and says who found it
    (``found_by``: ``dense``, ``bm25`` or ``dense+bm25``)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    dense, lexical = list(dense[:fusion.depth]), list(lexical[:fusion.depth])
    scores = rrf_scores([[h.unit_id for h in dense], [h.unit_id for h in lexical]], [1.0, fusion.lexical_weight],
                        fusion.c)
    by_dense = {h.unit_id: h for h in dense}
    by_lexical = {h.unit_id: h for h in lexical}
    ranked = sorted(scores, key=lambda u: (-scores[u], u))[:k]
    out = []
    for u in ranked:
        found = "+".join(name for name, where in (("dense", by_dense), ("bm25", by_lexical)) if u in where)
        out.append(replace(by_dense.get(u) or by_lexical[u], score=scores[u], found_by=found))
    return out


def merge_shards(per_shard: Sequence[tuple[Sequence[Sequence[UnitHit]], Sequence[Sequence[UnitHit]]]], n_queries: int,
                 k: int, fusion: Fusion = Fusion()) -> list[list[UnitHit]]:
    """Per query, the fused top ``k`` from every answering shard's ``(dense rows, lexical rows)``
    (each shard's top ``max(k, depth)`` per signal): each signal merged over the shards first, then fused."""
    from longrag.index.maxp import merge_topk

    depth = max(k, fusion.depth)
    return [fuse(merge_topk([d[q] for d, _ in per_shard], depth), merge_topk([lx[q] for _, lx in per_shard], depth),
                 k, fusion) for q in range(n_queries)]


def merge_answers(per_shard: Sequence[object], n_queries: int, k: int, fusion: Fusion | None) -> list[list[UnitHit]]:
    """Per query, the top ``k`` from every answering shard's answer: ``search``'s rows merged by
    MaxP score (``fusion`` None), or ``hybrid_search``'s ``(dense rows, lexical rows)`` fused
    (:func:`merge_shards`)."""
    from longrag.index.maxp import merge_topk

    if fusion is not None:
        return merge_shards(per_shard, n_queries, k, fusion)  # type: ignore[arg-type]
    return [merge_topk([rows[q] for rows in per_shard], k) for q in range(n_queries)]
