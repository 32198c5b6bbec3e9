"""Typed configuration of the Mixture-of-PageRanks retriever (Alonso and Millidge, 2024,
"Mixture-of-PageRanks: Replacing Long-Context with Real-Time, Sparse GraphRAG", Section 4 and
Appendix A.2).

Defaults are the paper's: sentence chunks of at most 32 words, TF-IDF embeddings, similarity
threshold 0.27, at most 18 power iterations, restart probability 0.6 for local (specific) queries
and 0 for global ones (summaries, frequent words), top-100 chunks returned in document order.

Conventions (read before changing ``alpha_*``):

* ``alpha`` is the RESTART (teleport) probability, as in the paper's ``pi = (1-alpha) A pi +
  alpha p``. networkx's ``pagerank(alpha=...)`` is the DAMPING factor, i.e. ``1 - alpha`` here.
* ``alpha = 0`` ("plain PageRank", the global expert) is defined as the paper's networkx-style
  implementation computes it: power iteration ``pi <- A pi`` started from the uniform
  distribution, with dangling mass spread uniformly, for at most ``max_iter`` steps. With self
  loops kept (the default) every connected component is aperiodic, so run to convergence it gives
  the stationary distribution reached from the uniform start: a component C holds mass |C|/N,
  shared in proportion to the chunks' weighted degrees. ``global_teleport > 0`` adds a uniform
  restart instead (classic PageRank with damping ``1 - global_teleport``), unique on any graph.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class MixPRConfig(BaseModel):
    """Every knob of MixPR and its two baselines (RAG-Sparse, RAG-Hybrid)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- chunking (Section 4, "Chunking method")
    max_words: int = Field(32, ge=1, description="A sentence over this many words is split (newlines, then equal pieces).")

    # --- TF-IDF embeddings (scikit-learn TfidfVectorizer, L2-normalised rows)
    lowercase: bool = True
    token_pattern: str = Field(r"(?u)\b\w\w+\b", description="scikit-learn's default word pattern.")
    sublinear_tf: bool = False
    stop_words: Literal["english"] | None = Field(None, description="The paper keeps every word (None).")

    # --- graph A = normalize(E E^T) (Section 4, Appendix A.2)
    threshold: float = Field(0.27, ge=0.0, le=1.0, description="Similarities below this are dropped (kept: >= threshold).")
    self_loops: bool = Field(True, description="Keep the diagonal of E E^T (each chunk's similarity 1 to itself).")
    block_rows: int = Field(4096, ge=1, description="Rows of E E^T computed per block (bounds peak memory).")
    prune: bool = Field(
        True,
        description="Exact pruning of the product: pairs whose only shared words are frequent ones are "
        "bounded first and computed only when the bound reaches the threshold (same graph, faster).",
    )

    # --- PageRank (Appendix A.2)
    alpha_local: float = Field(0.6, gt=0.0, le=1.0, description="Restart probability of the PPR expert (local queries).")
    alpha_global: float = Field(0.0, ge=0.0, lt=1.0, description="Restart probability of the PR expert (global queries).")
    global_teleport: float = Field(
        0.0, ge=0.0, lt=1.0, description="Uniform restart added in global mode; 0 = the paper's plain PageRank."
    )
    max_iter: int = Field(18, ge=1, description="Power iterations at most (the paper stops at 18, never raises).")
    tol: float | None = Field(
        1e-6,
        gt=0.0,
        description="Stop early when the L1 change of pi is below tol (not networkx's n*tol, which stops "
        "after ~4 steps on 100K-chunk graphs); None = always max_iter.",
    )

    # --- personalization vector p
    short_query_words: int = Field(
        3, ge=0, description="When the last chunk has fewer words, p is split 0.5/0.5 over the last two chunks."
    )
    question_seeds: int = Field(
        0, ge=0, description="Beyond the paper: also seed p with the chunks most similar (TF-IDF) to a given question."
    )
    question_seed_weight: float = Field(
        0.5, ge=0.0, le=1.0, description="Share of p on those seeds (the rest stays on the query chunks)."
    )
    append_question: bool = Field(
        True,
        description="A separately given question is appended to the document as its last chunk(s), as the paper's "
        "benchmarks do; those chunks form p and are never returned.",
    )

    # --- output
    top_k: int = Field(100, ge=1, description="Chunks returned, in document order.")

    # --- router (Section 4 "Dynamic alpha", Appendix A.2)
    router_fallback: Literal["local", "global"] = Field(
        "local", description="Route taken when the LLM's reply starts with neither y nor n."
    )
    router_context_chunks: int = Field(2, ge=1, description="First and last chunks shown to the router.")
    router_max_tokens: int = Field(4, ge=1)

    # --- long-context reading (longrag.reading.longcontext) and its endpoint
    answer_max_tokens: int = Field(128, ge=1, description="Tokens the reader may generate for the answer.")
    short_answer: bool = Field(
        True, description="With a question: ask for the answer alone and finish it as the LongReader's direct answer "
        "(cleaned, yes/no for a yes/no question; not cut to a span); off: the reader's reply as it comes (open-ended "
        "requests). Without a question (the document's own closing request) the reply is always kept whole.",
    )
    short_answer_max_tokens: int = Field(
        32, ge=1, description="Tokens the reader may generate for a short answer (the bare prompt's budget); the "
        "smaller of this and answer_max_tokens applies. A longer budget lets a small model run on past the answer "
        "(0.5B, MuSiQue, 50 questions: F1 21.3 at 128 tokens against the bare prompt's 21.7 at 32).",
    )
    reader_reserve_tokens: int = Field(
        64, ge=0, description="Tokens kept free in the reader's window beyond the prompt and the answer."
    )
    max_document_bytes: int = Field(
        64 * 1024 * 1024, ge=1, description="POST /v1/longcontext: larger documents (UTF-8 bytes) get 413."
    )

    # --- RAG-Hybrid baseline (Appendix A.2)
    hybrid_sparse_weight: float = Field(0.15, ge=0.0, le=1.0)
    hybrid_dense_weight: float = Field(0.85, ge=0.0, le=1.0)
