"""Dual-perspective LongRAG on Serve: Extractor, Filter and Generator as separate deployments, and the
``DualReader`` that chunks, retrieves and runs a strategy with them.

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Sections 4.2-4.4, 5.3-5.4: the extractor and the filter can run on
small models and the generator on a stronger one. Each stage deployment has its own autoscaling
(``deployments:`` in the Serve YAML) and its own model: ``dual.extractor_llm`` / ``dual.filter_llm`` /
``dual.generator_llm`` (an ``LLMConfig``: a bundled GGUF in process, or an OpenAI-compatible URL such as a
vLLM deployment); unset, a stage talks to the app's shared ``LLMServer``. The deployments are shells
around :class:`longrag.dual.pipeline.DualPipeline` (one stage method each) and
:class:`longrag.dual.service.DualService` (chunking, dense + rerank, strategy).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from longrag.config import DualConfig, EmbeddingConfig, LLMConfig
from longrag.dual.chunking import SourceParagraph
from longrag.dual.service import DualAnswer
from longrag.llm.base import LLM
from longrag.types import Unit

__all__ = ["DualExtractor", "DualFilter", "DualGenerator", "DualReader", "RemoteStage", "stage_llm", "units_to_paragraphs"]

STAGES = ("extractor", "filter", "generator")


def stage_llm(stage: str, dual: DualConfig, app_llm: LLMConfig, llm_handle: DeploymentHandle | None) -> LLM:
    """The stage's own model (``dual.<stage>_llm``, built in this replica) or the app's, reached through
    the shared ``LLMServer``."""
    own = getattr(dual, f"{stage}_llm")
    if own is not None:
        from serve.llm_handle import build_engine

        return build_engine(own)
    from serve.deployments import RemoteLLM

    if llm_handle is None:
        raise ValueError(f"the {stage} stage has no model: set dual.{stage}_llm or give the LLMServer handle")
    return RemoteLLM(llm_handle, app_llm)


class _Stage:
    """One stage of the pipeline on its own model; ``describe`` names it."""

    stage = ""

    def __init__(self, llm_handle: DeploymentHandle | None, llm: LLMConfig, dual: DualConfig) -> None:
        from longrag.dual.pipeline import DualPipeline

        self.config = dual
        self.llm = stage_llm(self.stage, self.config, llm, llm_handle)
        self.pipeline = DualPipeline(self.llm, self.config)

    def describe(self) -> dict[str, Any]:
        return {"stage": self.stage, "model": self.llm.name, "context_window": self.llm.context_window,
                "json_schema": bool(self.llm.supports_json_schema)}  # fmt: skip


@serve.deployment(ray_actor_options={"num_cpus": 0.005}, max_ongoing_requests=16)
class DualExtractor(_Stage):
    stage = "extractor"

    async def extract(self, question: str, chunks: list, paragraphs: dict) -> tuple:
        return await self.pipeline.extract(question, chunks, paragraphs)


@serve.deployment(ray_actor_options={"num_cpus": 0.005}, max_ongoing_requests=16)
class DualFilter(_Stage):
    stage = "filter"

    async def filter(self, question: str, chunks: list) -> tuple:
        return await self.pipeline.filter(question, chunks)


@serve.deployment(ray_actor_options={"num_cpus": 0.005}, max_ongoing_requests=16)
class DualGenerator(_Stage):
    stage = "generator"

    async def generate(self, question: str, details: list, global_information: str | None = None) -> tuple:
        return await self.pipeline.generate(question, details, global_information)


class RemoteStage:
    """A stage deployment behind the pipeline's stage interface (``extract`` / ``filter`` / ``generate``)."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle

    async def extract(self, question, chunks, paragraphs):
        return await self.handle.extract.remote(question, list(chunks), dict(paragraphs))

    async def filter(self, question, chunks):
        return await self.handle.filter.remote(question, list(chunks))

    async def generate(self, question, details, global_information=None):
        return await self.handle.generate.remote(question, list(details), global_information)


def units_to_paragraphs(units: Sequence[Unit]) -> list[SourceParagraph]:
    """Retrieved units as source paragraphs: a unit's blank-line paragraphs (a grouped unit's
    documents), ids ``unit_id/i``, titled with the unit's first title; units without text are left out."""
    from longrag.dual.chunking import split_document

    out: list[SourceParagraph] = []
    for u in units:
        if not (u.text or "").strip():
            continue
        title = u.titles[0] if u.titles else ""
        out += [SourceParagraph(p.id, p.text, title) for p in split_document(u.text, u.unit_id)]
    return out


@serve.deployment(ray_actor_options={"num_cpus": 0.005}, max_ongoing_requests=4)
class DualReader:
    """Chunks a request's text, retrieves (dense, reranked when ``dual.reranker`` is set) and runs a
    strategy with the three stage deployments."""

    def __init__(
        self, extractor: DeploymentHandle, filter: DeploymentHandle, generator: DeploymentHandle,  # noqa: A002
        dual: DualConfig, embedding: EmbeddingConfig, encoder_cls: Callable[[EmbeddingConfig], Any] | None = None,
        torch_threads: int = 1,
    ) -> None:  # fmt: skip
        from longrag.dual.pipeline import DualPipeline

        self.config = dual
        self.embedding = embedding
        self.encoder_cls = encoder_cls  # None: the bundled Embedder; tests inject a fake (tests/fakes.py)
        self.torch_threads = torch_threads
        self.pipeline = DualPipeline(None, self.config, extractor=RemoteStage(extractor), filter=RemoteStage(filter),
                                     generator=RemoteStage(generator))  # fmt: skip
        self.service = None
        self._lock = asyncio.Lock()

    async def _service(self):
        async with self._lock:
            if self.service is None:
                self.service = await asyncio.to_thread(self._load)
        return self.service

    def _load(self):
        import torch

        from longrag.dual.rerank import load_reranker
        from longrag.dual.service import DualService
        from longrag.index.embedding import Embedder
        from serve.deployments import replica_device

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(self.torch_threads)
        device = replica_device(self.embedding.device)
        encoder = (self.encoder_cls or Embedder)(self.embedding.model_copy(update={"device": device}))
        scorer = load_reranker(self.config.reranker) if self.config.reranker else None
        return DualService(self.pipeline, encoder, scorer, self.config)

    async def document(self, document: str, question: str, strategy: str | None, k: int | None = None,
                       retrieve_only: bool = False) -> DualAnswer:  # fmt: skip
        """One long document (``/v1/longcontext`` with a strategy). Raises ValueError on bad input."""
        svc = await self._service()
        return await svc.over_document(document, question, strategy, k, retrieve_only)

    async def units(self, question: str, units: list[Unit], strategy: str | None,
                    k: int | None = None) -> DualAnswer:  # fmt: skip
        """The units the index retrieved (``/v1/answer`` with a strategy, model ``longrag-dual``)."""
        svc = await self._service()
        return await svc.over_paragraphs(units_to_paragraphs(units), question, strategy, k)


def bind_dual(cfg: Any, llm_handle: Any, encoder_cls: Any = None) -> Any:
    """The bound ``DualReader`` (with its three stage deployments) of an app config ``cfg``;
    ``encoder_cls`` builds its chunk encoder (None: the bundled one)."""
    from serve.longcontext import longcontext_embedding

    return DualReader.bind(
        DualExtractor.bind(llm_handle, cfg.llm, cfg.dual), DualFilter.bind(llm_handle, cfg.llm, cfg.dual),
        DualGenerator.bind(llm_handle, cfg.llm, cfg.dual), cfg.dual, longcontext_embedding(cfg.embedding), encoder_cls,
    )  # fmt: skip
