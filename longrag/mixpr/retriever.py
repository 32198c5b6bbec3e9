"""MixPR: chunk -> TF-IDF -> similarity graph -> (personalized) PageRank -> top-k in document order.

The query. As in the paper's benchmarks, the query is part of the text: with ``question=None`` the
query chunks are the last chunk of the document, or the last two (mass 0.5 each) when the last
one has fewer than ``short_query_words`` words. A question given separately is appended to the
document (``append_question``): its chunks form the query, share ``p`` uniformly, and are never
returned. Beyond the paper, ``question_seeds > 0`` also puts ``question_seed_weight`` of ``p`` on the
document chunks most similar (TF-IDF cosine) to the query text.

Routes: "local" runs PPR with ``alpha_local`` (0.6); "global" runs plain PageRank (``alpha_global``
= 0, see :mod:`longrag.mixpr.config` for what that means exactly). ``aretrieve_auto`` asks an LLM
router first.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from longrag.mixpr.chunking import Chunks, chunk_text
from longrag.mixpr.config import MixPRConfig
from longrag.mixpr.graph import similarity_graph
from longrag.mixpr.pagerank import personalized_pagerank
from longrag.mixpr.router import Route, route_query, router_text
from longrag.mixpr.tfidf import TfidfEmbedding, embed_tfidf

__all__ = [
    "RetrievedChunk", "MixPRResult", "PreparedDocument", "prepare_document", "query_edge_count", "top_k_in_order",
    "MixPRRetriever",
]  # fmt: skip


@dataclass
class RetrievedChunk:
    """One returned chunk: ``position`` is its index among the document's chunks, ``start:end`` its
    character span in the document."""

    position: int
    text: str
    score: float
    start: int
    end: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MixPRResult:
    """Chunks (document order) plus the trace: route, alpha, sizes, iterations, per-stage seconds.

    ``query_edges`` is the number of graph edges from the query chunk(s) to other chunks (None for
    the baselines, which build no graph); ``notes`` say in words what the numbers imply, e.g. that
    the query chunk has no edge, so PageRank had nothing to spread along."""

    chunks: list[RetrievedChunk]
    route: Route
    alpha: float
    n_chunks: int
    n_distinct: int
    n_edges: int
    iterations: int
    converged: bool
    timings: dict[str, float] = field(default_factory=dict)
    query_edges: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["chunks"] = [c.to_dict() for c in self.chunks]
        return d


@dataclass
class PreparedDocument:
    """A chunked, embedded document with its query definition (shared by MixPR and baselines).

    ``chunks`` covers the document followed by the appended question (if any); the first
    ``n_doc`` chunks are the document's. ``query`` are chunk indices forming the query and
    ``query_weights`` their share of ``p``."""

    chunks: Chunks
    n_doc: int
    embedding: TfidfEmbedding
    query: np.ndarray
    query_weights: np.ndarray
    query_text: str
    timings: dict[str, float]


def _query_chunks(n_words: np.ndarray, short_words: int) -> tuple[np.ndarray, np.ndarray]:
    n = n_words.shape[0]
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    if n >= 2 and n_words[-1] < short_words:
        return np.array([n - 2, n - 1], np.int64), np.array([0.5, 0.5])
    return np.array([n - 1], np.int64), np.array([1.0])


def prepare_document(document: str, question: str | None, config: MixPRConfig) -> PreparedDocument:
    """Chunk ``document`` (and the question, when given and ``append_question``), embed with TF-IDF
    and define the query chunks."""
    if not isinstance(document, str):
        raise ValueError(f"document must be str, got {type(document).__name__}")
    if question is not None and not isinstance(question, str):
        raise ValueError(f"question must be str or None, got {type(question).__name__}")
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    chunks = chunk_text(document, config.max_words)
    n_doc = len(chunks)
    if question is not None and question.strip() and config.append_question:
        qchunks = chunk_text(question, config.max_words)
        chunks = chunks.concat(qchunks, offset=len(document) + 1)  # spans as if joined by "\n"
        query = np.arange(n_doc, len(chunks), dtype=np.int64)
        weights = np.full(query.size, 1.0 / max(query.size, 1))
        query_text = question
    else:
        query, weights = _query_chunks(chunks.n_words, config.short_query_words)
        query_text = question if question else " ".join(chunks.texts[i] for i in query)
    t1 = time.perf_counter()
    emb = embed_tfidf(chunks.texts, config)
    t2 = time.perf_counter()
    timings["chunk"] = t1 - t0
    timings["embed"] = t2 - t1
    return PreparedDocument(chunks, n_doc, emb, query, weights, query_text, timings)


def top_k_in_order(scores: np.ndarray, k: int, n_candidates: int) -> np.ndarray:
    """Positions of the ``k`` best of ``scores[:n_candidates]`` (ties: earlier position first),
    returned in ascending (document) order."""
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-D, got shape {scores.shape}")
    n = min(n_candidates, scores.shape[0])
    if n <= 0 or k <= 0:
        return np.zeros(0, np.int64)
    s = scores[:n]
    if k >= n:
        return np.arange(n, dtype=np.int64)
    # partition first (O(n)), then settle ties at the boundary by position
    kth = np.partition(-s, k - 1)[k - 1]
    better = np.flatnonzero(-s < kth)
    tied = np.flatnonzero(-s == kth)[: k - better.size]
    return np.sort(np.concatenate([better, tied]))


def query_edge_count(S: Any, prep: PreparedDocument) -> int:
    """Edges of the distinct-chunk graph ``S`` from the query chunks' rows to other chunks (self loops
    and edges among the query chunks themselves left out)."""
    if prep.query.size == 0:
        return 0
    q = np.unique(prep.embedding.classes[prep.query])
    rows = S[q].tocoo()
    return int(np.count_nonzero(~np.isin(rows.col, q) & (rows.data != 0)))


def _to_chunks(prep: PreparedDocument, positions: np.ndarray, scores: np.ndarray) -> list[RetrievedChunk]:
    ch = prep.chunks
    return [
        RetrievedChunk(int(i), ch.texts[i], float(scores[i]), int(ch.starts[i]), int(ch.ends[i])) for i in positions
    ]


class MixPRRetriever:
    """Mixture-of-PageRanks retriever (Alonso and Millidge, 2024, Section 4). Stateless between calls;
    thread-safe."""

    def __init__(self, config: MixPRConfig | None = None):
        self.config = config or MixPRConfig()

    # -- the pieces, exposed for the benchmark and tests
    def personalization(self, prep: PreparedDocument) -> np.ndarray:
        """``p`` over all chunks (n,), float64, sums to one (uniform for an empty query)."""
        cfg = self.config
        n = len(prep.chunks)
        p = np.zeros(n)
        if prep.query.size == 0:
            return np.full(n, 1.0 / n) if n else p
        p[prep.query] = prep.query_weights
        if cfg.question_seeds > 0 and prep.n_doc > 0 and cfg.question_seed_weight > 0:
            q = prep.embedding.transform([prep.query_text])
            sims = np.asarray((prep.embedding.matrix @ q.T).todense()).ravel()[prep.embedding.classes[: prep.n_doc]]
            cand = np.setdiff1d(np.flatnonzero(sims > 0), prep.query)
            if cand.size:
                best = cand[np.argsort(-sims[cand], kind="stable")[: cfg.question_seeds]]
                p *= 1.0 - cfg.question_seed_weight
                p[best] += cfg.question_seed_weight * sims[best] / sims[best].sum()
        return p / p.sum()

    def rank(self, prep: PreparedDocument, route: Route = "local") -> MixPRResult:
        """Graph + PageRank + top-k on an already prepared document."""
        cfg = self.config
        if route not in ("local", "global"):
            raise ValueError(f"route must be 'local' or 'global', got {route!r}")
        timings = dict(prep.timings)
        n = len(prep.chunks)
        emb = prep.embedding
        t0 = time.perf_counter()
        S, stats = similarity_graph(
            emb.matrix, cfg.threshold, self_loops=cfg.self_loops, block_rows=cfg.block_rows,
            method="pruned" if cfg.prune else "blocked",
        )  # fmt: skip
        t1 = time.perf_counter()
        if route == "local":
            alpha, p = cfg.alpha_local, self.personalization(prep)
            dangling = None  # dangling mass restarts at the query (networkx's default)
        else:
            if cfg.global_teleport > 0:
                alpha, p = cfg.global_teleport, None  # classic PageRank: uniform restart
            else:
                alpha = cfg.alpha_global
                p = self.personalization(prep) if alpha > 0 else None
            dangling = np.full(n, 1.0 / n) if n else None  # query-independent
        if n:
            pr = personalized_pagerank(
                S, p, alpha, max_iter=cfg.max_iter, tol=cfg.tol, dangling=dangling, classes=emb.classes
            )
            scores, iters, conv = pr.scores, pr.n_iter, pr.converged
        else:
            scores, iters, conv = np.zeros(0), 0, True
        t2 = time.perf_counter()
        pos = top_k_in_order(scores, cfg.top_k, prep.n_doc)
        out = _to_chunks(prep, pos, scores)
        t3 = time.perf_counter()
        timings.update(graph=t1 - t0, pagerank=t2 - t1, topk=t3 - t2)
        timings["total"] = sum(timings[k] for k in ("chunk", "embed", "graph", "pagerank", "topk"))
        q_edges = query_edge_count(S, prep)
        notes = []
        if route == "local" and prep.query.size and prep.n_doc and q_edges == 0:
            seeded = cfg.question_seeds > 0 and cfg.question_seed_weight > 0
            notes.append(
                f"the query chunk has no edge: no chunk reaches similarity {cfg.threshold} with it, so "
                "personalized PageRank cannot spread from the query"
                + (" (only the question seeds carry it)" if seeded else " and the ranking carries no query signal")
                + "; check how the document was chunked (e.g. several facts in one chunk) or lower mixpr.threshold"
            )
        return MixPRResult(
            chunks=out, route=route, alpha=alpha, n_chunks=prep.n_doc, n_distinct=int(emb.matrix.shape[0]),
            n_edges=stats.n_edges, iterations=iters, converged=conv, timings=timings, query_edges=q_edges,
            notes=notes,
        )  # fmt: skip

    # -- public API
    def retrieve_with_trace(
        self, document: str, question: str | None = None, route: Route = "local"
    ) -> MixPRResult:
        """Top-k chunks of ``document`` for ``question`` (None: the document's last chunk(s) are the
        query) under ``route``, with the trace."""
        return self.rank(prepare_document(document, question, self.config), route)

    def retrieve(
        self, document: str, question: str | None = None, route: Route = "local"
    ) -> list[RetrievedChunk]:
        """Top-k chunks in document order (see ``retrieve_with_trace``)."""
        return self.retrieve_with_trace(document, question, route).chunks

    async def aretrieve_auto(self, document: str, llm: Any, question: str | None = None) -> MixPRResult:
        """Ask ``llm`` (async ``chat``) to route, then retrieve. The router reads the question when
        given, else the first and last ``router_context_chunks`` chunks of the document."""
        cfg = self.config
        prep = prepare_document(document, question, cfg)
        t0 = time.perf_counter()
        text = question if question else router_text(prep.chunks.texts, cfg.router_context_chunks)
        route = await route_query(llm, text, fallback=cfg.router_fallback, max_tokens=cfg.router_max_tokens)
        prep.timings["route"] = time.perf_counter() - t0
        return self.rank(prep, route)
