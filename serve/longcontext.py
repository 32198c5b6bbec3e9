"""``POST /v1/longcontext``: one request carries a long document (and optionally a question);
MixPR (or a baseline) picks the chunks, the LLM reads them.

``LongContextReader`` is a thin Serve shell around :class:`longrag.longcontext.LongContextPipeline`:
it owns the pipeline, talks to the shared ``LLMServer`` deployment through ``RemoteLLM`` (router
and reader calls), and loads the dense encoder only when a request asks for ``retriever=hybrid``.
Retrieval is CPU work; it runs in a worker thread, ``max_ongoing_requests`` bounds how many large
documents a replica holds at once.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from ray import serve
from ray.serve.handle import DeploymentHandle

from longrag.config import EmbeddingConfig, LLMConfig
from longrag.mixpr import MixPRConfig

__all__ = ["LongContextRequest", "LongContextChunk", "LongContextResponse", "LongContextReader"]


class LongContextRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    document: str = Field(..., description="The whole document (UTF-8 text), up to mixpr.max_document_bytes bytes.")
    question: str | None = Field(
        None, description="The question; omitted: the document's last sentence(s) are the query (paper 003)."
    )
    retriever: Literal["mixpr", "sparse", "hybrid"] = Field("mixpr", description="MixPR, RAG-Sparse or RAG-Hybrid.")
    k: int | None = Field(None, ge=1, le=10000, description="Chunks to retrieve; default mixpr.top_k.")
    route: Literal["auto", "local", "global"] = Field(
        "auto", description="MixPR only: auto = the LLM router decides; local = personalized PageRank; global = PageRank."
    )
    retrieve_only: bool = Field(False, description="Skip the reader: return the chunks without an answer.")

    @field_validator("document")
    @classmethod
    def _not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("document is empty (no non-whitespace text)")
        return v


class LongContextChunk(BaseModel):
    position: int = Field(description="Index of the chunk among the document's chunks (document order).")
    text: str
    score: float


class LongContextResponse(BaseModel):
    answer: str | None = None
    route: Literal["local", "global"] | None = Field(description="The route taken (None for the baselines).")
    chunks: list[LongContextChunk]
    trace: dict[str, Any]


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=4)
class LongContextReader:
    def __init__(
        self, llm_handle: DeploymentHandle, llm: dict[str, Any], mixpr: dict[str, Any],
        embedding: dict[str, Any] | None = None, torch_threads: int = 1,
    ) -> None:  # fmt: skip
        from longrag.longcontext import LongContextPipeline
        from serve.deployments import RemoteLLM

        self.config = MixPRConfig.model_validate(mixpr)
        self.embedding = EmbeddingConfig.model_validate(embedding or {})
        self.torch_threads = torch_threads
        self.pipeline = LongContextPipeline(self.config, llm=RemoteLLM(llm_handle, LLMConfig.model_validate(llm)))
        self._encoder_lock = asyncio.Lock()

    async def _ensure_encoder(self) -> None:
        async with self._encoder_lock:
            if self.pipeline.encoder is None:
                self.pipeline.encoder = await asyncio.to_thread(self._load_encoder)

    def _load_encoder(self):
        import torch

        from longrag.embedding import Embedder

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(self.torch_threads)
        return Embedder(self.embedding)

    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """``request``: a :class:`LongContextRequest` as a dict -> a :class:`LongContextResponse`
        as a dict. Raises ValueError on bad input (the ingress maps it to 422)."""
        req = LongContextRequest.model_validate(request)
        if req.retriever == "hybrid":
            await self._ensure_encoder()
        result = await self.pipeline.run(
            req.document, req.question, retriever=req.retriever, k=req.k, route=req.route, read=not req.retrieve_only
        )
        return LongContextResponse(
            answer=result.answer, route=result.route, chunks=result.chunks, trace=result.trace
        ).model_dump()
