"""``POST /v1/longcontext``: one request carries a long document (and optionally a question);
MixPR (or a baseline) picks the chunks, the LLM reads them.

``LongContextReader`` is a thin Serve shell around :class:`longrag.reading.longcontext.LongContextPipeline`:
it owns the pipeline, talks to the shared ``LLMServer`` deployment through ``RemoteLLM`` (router
and reader calls), and loads the dense encoder only when a request asks for ``retriever=hybrid``.
Retrieval is CPU work; it runs in a worker thread, ``max_ongoing_requests`` bounds how many large
documents a replica holds at once.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator
from ray import serve
from ray.serve.handle import DeploymentHandle

from longrag.config import DualStrategy, EmbeddingConfig, LLMConfig
from longrag.mixpr import MixPRConfig
from serve.schemas import NOT_BLANK, STRATEGY_DESCRIPTION, check_encodable

__all__ = [
    "LongContextRequest", "LongContextChunk", "LongContextResponse", "LongContextReader", "longcontext_embedding",
]


class LongContextRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    document: str = Field(
        ..., min_length=1, json_schema_extra={"pattern": NOT_BLANK},
        description="The whole document (valid Unicode text), up to mixpr.max_document_bytes bytes of UTF-8 "
        "(larger: 413).",
    )
    question: str | None = Field(
        None, min_length=1, json_schema_extra={"pattern": NOT_BLANK},
        description="The question (at most serve.max_question_chars characters); omitted: the document's last "
        "sentence(s) are the query (Mixture-of-PageRanks, Alonso and Millidge, 2024, Section 4).",
    )
    retriever: Literal["mixpr", "sparse", "hybrid"] = Field("mixpr", description="MixPR, RAG-Sparse or RAG-Hybrid.")
    k: StrictInt | None = Field(None, ge=1, le=10000, description="Chunks to retrieve (1..10000); default mixpr.top_k.")
    route: Literal["auto", "local", "global"] = Field(
        "auto", description="MixPR only: auto = the LLM router decides; local = personalized PageRank; global = PageRank."
    )
    retrieve_only: bool = Field(False, description="Skip the reader: return the chunks without an answer.")
    strategy: DualStrategy | None = Field(
        None, description="Run dual-perspective LongRAG over the document's paragraphs instead of MixPR (needs a "
        "question; retriever and route do not apply; k = chunks kept after reranking, default dual.rerank_k). "
        + STRATEGY_DESCRIPTION,
    )

    # "before" validators run ahead of the type check, so a lone surrogate gets a clear message.
    @field_validator("document", mode="before")
    @classmethod
    def _document(cls, v: Any) -> Any:
        if isinstance(v, str):
            check_encodable(v, "document")
            if not v.strip():
                raise ValueError("document is empty (no non-whitespace text)")
        return v

    @field_validator("question", mode="before")
    @classmethod
    def _question(cls, v: Any) -> Any:
        if isinstance(v, str):
            check_encodable(v, "question")
            if not v.strip():
                raise ValueError("question is empty (no non-whitespace character); omit it to use the document's end")
        return v

    @model_validator(mode="after")
    def _dual(self) -> LongContextRequest:
        if self.strategy is not None:
            if self.question is None:
                raise ValueError(f"strategy {self.strategy!r} needs a question")
            mixpr_only = sorted({"retriever", "route"} & self.model_fields_set)
            if mixpr_only:
                raise ValueError(f"{' and '.join(mixpr_only)} are MixPR options; strategy runs the dual pipeline")
        return self


class LongContextChunk(BaseModel):
    position: int = Field(description="Index of the chunk among the document's chunks (document order).")
    text: str
    score: float
    paragraph_id: str | None = Field(None, description="With a strategy: the source paragraph (doc/i) of the chunk.")


class LongContextResponse(BaseModel):
    answer: str | None = None
    route: Literal["local", "global"] | None = Field(
        None, description="The route taken (None for the baselines and the dual strategies).")
    strategy: DualStrategy | None = Field(None, description="The dual strategy that answered, if any.")
    chunks: list[LongContextChunk]
    trace: dict[str, Any]


def longcontext_embedding(embedding: EmbeddingConfig) -> EmbeddingConfig:
    """The encoder config of the long-context reader (``retriever=hybrid``): the app's model, but
    the device of the reader's own replica. ``embedding.device`` is set for the ``QueryEncoder``
    (``cuda`` in ``gpu.yaml``, where that deployment asks for a GPU); the ``LongContextReader``
    usually has none, so it gets ``auto``, which :meth:`LongContextReader._load_encoder` resolves
    from the GPUs Ray gave its replica."""
    return embedding.model_copy(update={"device": "auto"})


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=4)
class LongContextReader:
    def __init__(
        self, llm_handle: DeploymentHandle, llm: LLMConfig, mixpr: MixPRConfig,
        embedding: EmbeddingConfig | None = None, torch_threads: int = 1,
    ) -> None:  # fmt: skip
        from longrag.reading.longcontext import LongContextPipeline
        from serve.deployments import RemoteLLM

        self.config = mixpr
        self.embedding = embedding or EmbeddingConfig()
        self.torch_threads = torch_threads
        self.pipeline = LongContextPipeline(self.config, llm=RemoteLLM(llm_handle, llm))
        self._encoder_lock = asyncio.Lock()

    async def _ensure_encoder(self) -> None:
        async with self._encoder_lock:
            if self.pipeline.encoder is None:
                self.pipeline.encoder = await asyncio.to_thread(self._load_encoder)

    def _load_encoder(self):
        import torch

        from longrag.index.embedding import Embedder
        from serve.deployments import replica_device

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(self.torch_threads)
        return Embedder(self.embedding.model_copy(update={"device": replica_device(self.embedding.device)}))

    async def run(self, req: LongContextRequest) -> LongContextResponse:
        """Raises ValueError on bad input (the ingress maps it to 422)."""
        if req.retriever == "hybrid":
            await self._ensure_encoder()
        result = await self.pipeline.run(
            req.document, req.question, retriever=req.retriever, k=req.k, route=req.route, read=not req.retrieve_only
        )
        return LongContextResponse(answer=result.answer, route=result.route, chunks=result.chunks, trace=result.trace)
