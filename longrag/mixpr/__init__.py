"""Mixture-of-PageRanks (MixPR) long-context retrieval (Alonso and Millidge, 2024, "Mixture-of-PageRanks:
Replacing Long-Context with Real-Time, Sparse GraphRAG", Section 4 and Appendix A.2).

Thin public API::

    from longrag.mixpr import MixPRConfig, MixPRRetriever, route_query
    r = MixPRRetriever(MixPRConfig())
    chunks = r.retrieve(document, question=None, route="local")      # list[RetrievedChunk], doc order
    result = r.retrieve_with_trace(document, question, route="global")  # + route, alpha, sizes, timings
    result = await r.aretrieve_auto(document, llm, question)           # LLM router picks the route
    route = await route_query(llm, text)                               # "local" | "global"

Baselines with the same chunks and query: ``SparseRetriever`` (RAG-Sparse), ``HybridRetriever``
(RAG-Hybrid, needs a dense encoder such as ``longrag.index.embedding.Embedder``).
"""

from longrag.mixpr.baselines import HybridRetriever, SparseRetriever
from longrag.mixpr.chunking import Chunks, chunk_text
from longrag.mixpr.config import MixPRConfig
from longrag.mixpr.graph import similarity_graph
from longrag.mixpr.pagerank import PageRankResult, personalized_pagerank
from longrag.mixpr.retriever import MixPRResult, MixPRRetriever, PreparedDocument, RetrievedChunk, prepare_document
from longrag.mixpr.router import Route, parse_route, route_query, router_prompt, router_text
from longrag.mixpr.tfidf import TfidfEmbedding, embed_tfidf

__all__ = [
    "Chunks",
    "HybridRetriever",
    "MixPRConfig",
    "MixPRResult",
    "MixPRRetriever",
    "PageRankResult",
    "PreparedDocument",
    "RetrievedChunk",
    "Route",
    "SparseRetriever",
    "TfidfEmbedding",
    "chunk_text",
    "embed_tfidf",
    "parse_route",
    "personalized_pagerank",
    "prepare_document",
    "route_query",
    "router_prompt",
    "router_text",
    "similarity_graph",
]
