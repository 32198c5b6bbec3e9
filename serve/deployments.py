"""Ray Serve deployments: thin shells around core objects.

* ``QueryEncoder`` owns an ``Embedder`` and batches concurrent questions (``@serve.batch``); a
  question that fails to encode fails alone, not the batch it shared;
* ``Retriever`` holds a ``ShardedIndex`` over the app's shared index tier (one set of named
  ``IndexShard`` actors per build, R replicas per shard, see :mod:`actors.index_tier`): scaling
  Retriever replicas scales the scatter/gather front, not the copies of the index;
* ``LLMServer`` owns an in-process LLM (llama.cpp on CPU); on GPU clusters the reader talks to a
  vLLM deployment of ``ray.serve.llm`` (or any OpenAI-compatible URL) instead;
* ``Reader`` owns the two-turn ``LongReader`` and talks to the LLM through ``RemoteLLM``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, Callable

import numpy as np
from ray import serve
from ray.serve.handle import DeploymentHandle

from actors.index_tier import SharedIndexTier
from longrag.config import EmbeddingConfig, IndexConfig, LLMConfig, ReaderConfig
from longrag.llm.base import LLM, ChatResult
from longrag.types import Unit, UnitHit


class BadQuestion(ValueError):
    """A question the encoder cannot take (it fails alone; the Ingress maps it to 422)."""


# CPU asks are fractions so the whole app (plus its shard actors) fits a 2-core machine; they are
# reservations for scheduling, the real threads are set per deployment (torch/FAISS/llama.cpp).
@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64)
class QueryEncoder:
    def __init__(self, embedding: dict[str, Any], torch_threads: int = 1) -> None:
        import torch

        from longrag.index.embedding import Embedder

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(torch_threads)
        self.embedder = Embedder(EmbeddingConfig.model_validate(embedding))

    async def encode(self, question: str) -> np.ndarray:
        """One question -> its vector; raises :class:`BadQuestion` for this question only."""
        result = await self.encode_batch(question)
        if isinstance(result, Exception):
            raise result
        return result

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def encode_batch(self, questions: list[str]) -> list[np.ndarray | Exception]:
        """Concurrent questions encoded together. Serve hands each caller its own list item, so a
        bad item is returned as an exception object (re-raised by :meth:`encode` for its caller
        alone) instead of failing every question that shared the batch."""
        return await asyncio.to_thread(self._encode_isolated, questions)

    def _encode_isolated(self, questions: list[str]) -> list[np.ndarray | Exception]:
        out: list[np.ndarray | Exception | None] = [None] * len(questions)
        good = []
        for i, q in enumerate(questions):
            problem = _question_problem(q)
            if problem:
                out[i] = BadQuestion(problem)
            else:
                good.append(i)
        if good:
            try:
                vectors = self.embedder.encode_queries([questions[i] for i in good])
                for i, v in zip(good, vectors):
                    out[i] = v
            except Exception:  # something in the batch broke the encoder: find it, one question at a time
                for i in good:
                    try:
                        out[i] = self.embedder.encode_queries([questions[i]])[0]
                    except Exception as exc:
                        out[i] = BadQuestion(f"the question could not be encoded: {type(exc).__name__}: {exc}")
        return out  # type: ignore[return-value]


def _question_problem(q: Any) -> str | None:
    if not isinstance(q, str):
        return f"a question must be a string, got {type(q).__name__}"
    try:
        q.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"the question is not valid Unicode text (a lone surrogate at character {exc.start})"
    return None


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=64)
class Retriever:
    """Scatter/gather over the app's shared index tier. Healthy while every shard has at least one
    live replica actor; ``describe`` reports the redundancy left ("1 of 2 replicas")."""

    def __init__(self, index_uri: str, index: dict[str, Any], ready_timeout_s: float = 300.0) -> None:
        cfg = IndexConfig.model_validate(index)
        from longrag.store import ArtifactStore

        self.manifest = ArtifactStore.open(index_uri).read_manifest()
        ctx = serve.get_replica_context()
        self.tier = SharedIndexTier(
            index_uri, self.manifest.build_id, app_name=ctx.app_name, holder=str(ctx.replica_id),
            launch={"replicas": cfg.replicas, "num_cpus": cfg.shard_num_cpus, "search_params": cfg.search_params,
                    "threads": cfg.shard_threads},
            timeout_s=cfg.search_timeout_s,
        )
        self.index = self.tier.acquire()
        self.index.wait_ready(timeout_s=ready_timeout_s)
        self.live: list[list[bool]] = [[True] * len(row) for row in self.index.replicas]

    async def retrieve(self, vector: np.ndarray, k: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        res = await self.index.search(np.asarray(vector, dtype=np.float32)[None, :], k)
        t1 = time.perf_counter()
        hits = res.hits[0]
        units = await self.index.fetch_units(hits)
        t2 = time.perf_counter()
        return {
            "hits": [h.to_dict() for h in hits],
            "units": units,
            "coverage": res.coverage.to_dict(),
            "trace": {"search_ms": round((t1 - t0) * 1e3, 2), "fetch_ms": round((t2 - t1) * 1e3, 2),
                      "shard_ms": res.shard_ms},
        }

    async def describe(self) -> dict[str, Any]:
        m = self.manifest
        self.live = await self.index.liveness()
        return {"build_id": m.build_id, "shards": len(m.shards), "units": m.counts.units,
                "chunks": m.counts.chunks, "embedding_model": m.embedding.model,
                "index": [{"shard": s, "live": sum(row), "replicas": len(row)} for s, row in enumerate(self.live)]}

    async def check_health(self) -> None:
        """Unhealthy (Serve replaces the replica) only when some shard has no live replica: every
        replica of every shard is pinged, so a dead replica 0 next to a live replica 1 is fine."""
        if not await self.tier.renew():  # the lease is gone (see actors.index_tier): hold a new one
            self.index = await asyncio.to_thread(self.tier.acquire)
        self.live = await self.index.liveness()
        dead = [s for s, row in enumerate(self.live) if not any(row)]
        if dead:
            raise RuntimeError(f"no replica of shard(s) {dead} answered a ping "
                               f"({', '.join(f'shard {s}: {sum(r)} of {len(r)}' for s, r in enumerate(self.live))})")

    async def __del__(self) -> None:
        """Serve's graceful shutdown: release this replica's hold on the shared index tier."""
        await self.tier.release()


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=8)
class LLMServer:
    """An in-process LLM behind a deployment; its calls run one at a time per replica."""

    def __init__(self, llm: dict[str, Any]) -> None:
        from longrag.llm.factory import build_llm

        self.config = LLMConfig.model_validate(llm)
        self.llm = build_llm(self.config)

    async def chat(self, messages: list[dict[str, str]], max_tokens: int, temperature: float | None = None,
                   stop: list[str] | None = None) -> dict[str, Any]:
        res = await self.llm.chat(messages, max_tokens=max_tokens, temperature=temperature, stop=stop)
        return res.to_dict()

    async def complete(self, prompt: str, max_tokens: int, temperature: float | None = None,
                       stop: list[str] | None = None) -> dict[str, Any]:
        res = await self.llm.complete(prompt, max_tokens=max_tokens, temperature=temperature, stop=stop)
        return res.to_dict()

    async def chat_json(self, messages: list[dict[str, str]], schema: dict[str, Any], max_tokens: int,
                        temperature: float | None = None) -> dict[str, Any]:
        res = await self.llm.chat_json(messages, schema=schema, max_tokens=max_tokens, temperature=temperature)
        return res.to_dict()

    def describe(self) -> dict[str, Any]:
        return {"name": self.llm.name, "context_window": self.llm.context_window}


class RemoteLLM(LLM):
    """The core ``LLM`` interface over an ``LLMServer`` deployment handle.

    Token counting runs locally with a tokenizer-only copy of the same model (cheap: no weights),
    so the reader can fit its context without a round trip per count."""

    def __init__(self, handle: DeploymentHandle, config: LLMConfig, context_window: int | None = None) -> None:
        self.handle = handle
        self.config = config
        self._count = local_token_counter(config)
        self.context_window = context_window or config.context_window
        self.name = f"remote:{config.model}"
        # both backends constrain JSON (llama.cpp grammars, OpenAI response_format)
        self.supports_json_schema = config.backend in ("llamacpp", "openai")

    async def chat(self, messages, *, max_tokens, temperature=None, stop=None) -> ChatResult:  # type: ignore[override]
        res = await self.handle.chat.remote(messages, max_tokens, temperature, stop)
        return ChatResult(**res)

    async def complete(self, prompt, *, max_tokens, temperature=None, stop=None) -> ChatResult:  # type: ignore[override]
        res = await self.handle.complete.remote(prompt, max_tokens, temperature, stop)
        return ChatResult(**res)

    async def chat_json(self, messages, *, schema, max_tokens, temperature=None) -> ChatResult:  # type: ignore[override]
        res = await self.handle.chat_json.remote(messages, schema, max_tokens, temperature)
        return ChatResult(**res)

    def count_tokens(self, text: str) -> int:
        return self._count(text)


def local_token_counter(config: LLMConfig) -> Callable[[str], int]:
    """Token counting without the model's weights: llama.cpp loads the GGUF vocabulary only; an
    OpenAI-compatible server's tokenizer is not reachable, so its counts are estimates."""
    if config.backend == "llamacpp":
        from llama_cpp import Llama

        from longrag.llm.llamacpp import resolve_model_path

        vocab = Llama(model_path=str(resolve_model_path(config.model)), vocab_only=True, verbose=False)
        lock = threading.Lock()

        def count(text: str) -> int:
            if not text:
                return 0
            with lock:
                return len(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False))

        return count
    from longrag.llm.openai_http import estimate_tokens

    return estimate_tokens


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=32)
class Reader:
    def __init__(self, llm_handle: DeploymentHandle, llm: dict[str, Any], reader: dict[str, Any],
                 mixpr: dict[str, Any] | None = None) -> None:
        from functools import partial

        from longrag.reading.longcontext import compress_units_with_mixpr
        from longrag.mixpr.config import MixPRConfig
        from longrag.reading.reader import LongReader

        self.llm_handle = llm_handle
        self.llm = RemoteLLM(llm_handle, LLMConfig.model_validate(llm))
        self._window_known = False
        compressor = partial(compress_units_with_mixpr, cfg=MixPRConfig.model_validate(mixpr or {}))
        self.reader = LongReader(self.llm, ReaderConfig.model_validate(reader), compressor=compressor)

    async def read(self, question: str, units: list[dict[str, Any]], compression: str | None = None) -> dict[str, Any]:
        if not self._window_known:
            # The window the LLM really has (llama.cpp clamps n_ctx to the model's trained context);
            # asked on first use because a replica's constructor must not block on another deployment.
            self.llm.context_window = (await self.llm_handle.describe.remote())["context_window"]
            self._window_known = True
        result = await self.reader.read(question, [Unit.from_row(u) for u in units], compression)
        return result.to_dict()
