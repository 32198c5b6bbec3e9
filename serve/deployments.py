"""Ray Serve deployments: thin shells around core objects.

Each takes its config sections as objects (``longrag.config``) and, like ``ray.serve.llm``'s
``engine_cls``, an injectable backend (``encoder_cls``, ``index_cls``, ``engine_cls``; None: the
real one), so the Serve layer runs with fakes in fast tests (``tests/serve/test_app_fakes.py``) and
with the real models end to end (``tests/serve/test_app.py``). They answer with the core's typed
records (:class:`longrag.types.Retrieval`, :class:`longrag.llm.base.ChatResult`,
:class:`longrag.reading.reader.ReaderResult`), which pass through Ray as they are.

* ``QueryEncoder`` owns an ``Embedder`` and batches concurrent questions (``@serve.batch``); a
  question that fails to encode fails alone, not the batch it shared;
* ``Retriever`` holds a ``ShardedIndex`` over the build's index application (one Serve deployment
  per shard, R replicas each or autoscaled, see :mod:`serve.index_app`): scaling Retriever
  replicas scales the scatter/gather front, not the copies of the index;
* ``LLMServer`` owns an in-process LLM (llama.cpp on CPU); on GPU clusters the reader talks to a
  vLLM deployment of ``ray.serve.llm`` (or any OpenAI-compatible URL) instead;
* ``Reader`` owns the two-turn ``LongReader`` and talks to the LLM through ``RemoteLLM``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import ray
from ray import serve
from ray.serve.handle import DeploymentHandle

from longrag.config import EmbeddingConfig, IndexConfig, LLMConfig, ReaderConfig, RetrievalConfig
from longrag.index.fusion import Fusion
from longrag.index.graph import GraphExpansion, UnitGraph, expand
from longrag.index.manifest import DimensionMismatch, Manifest
from longrag.llm.base import LLM, ChatResult
from longrag.mixpr.config import MixPRConfig
from longrag.reading.reader import ReaderResult, ShortAnswer
from longrag.types import InvalidRequest, Retrieval, Unit
from serve.backend import IndexBackend, IndexBackendFactory
from serve.schemas import IndexDescription, LLMDescription, ShardRedundancy

log = logging.getLogger(__name__)


class BadQuestion(InvalidRequest):
    """A question the encoder cannot take (it fails alone; the Ingress maps it to 422)."""


def replica_device(device: str) -> str:
    """``auto`` -> ``cuda`` only when Ray assigned this worker a GPU (``num_gpus`` in the
    deployment's ``ray_actor_options``), else ``cpu``; an explicit device is kept."""
    if device != "auto":
        return device
    return "cuda" if ray.is_initialized() and ray.get_gpu_ids() else "cpu"


# CPU asks are fractions so the whole app (plus its shard actors) fits a 2-core machine; they are
# reservations for scheduling, the real threads are set per deployment (torch/FAISS/llama.cpp).
@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64)
class QueryEncoder:
    """``encoder_cls(embedding)`` builds the encoder (anything with ``encode_queries(list[str]) ->
    np.ndarray``); None: :func:`longrag.index.embedding.encoder` with ``torch_threads`` (OpenVINO IR
    without torch on a CPU, ``embedding.backend=auto``).

    With ``index`` (the build or alias the app serves), the replica refuses to start when its vectors'
    dimension differs from the build's (:class:`longrag.index.manifest.DimensionMismatch`, e.g. an
    ``embedding.dim`` override), instead of every search failing on shapes."""

    def __init__(self, embedding: EmbeddingConfig, encoder_cls: Callable[[EmbeddingConfig], Any] | None = None,
                 torch_threads: int = 1, index: str | None = None) -> None:
        if encoder_cls is None:
            from longrag.index.encoders import encoder

            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            self.embedder = encoder(embedding, replica_device(embedding.device), torch_threads)
        else:
            self.embedder = encoder_cls(embedding)
        log.info("query encoder: %r", self.embedder)
        self.inflight = 0
        if index is not None:
            from longrag.index.alias import resolve_build
            from longrag.index.artifacts import ArtifactStore

            manifest = ArtifactStore.open(resolve_build(index)[0]).read_manifest()
            dim = getattr(self.embedder, "dim", None) or self.embedder.encode_queries(["dimension probe"]).shape[1]
            manifest.check_query_dim(dim, f"the query encoder ({embedding.model}, embedding.dim={embedding.dim})")

    async def encode(self, question: str) -> np.ndarray:
        """One question -> its vector; raises :class:`BadQuestion` for this question only.

        A question alone is encoded at once; while others are being encoded it joins a batch
        (``encode_batch``: up to 16, after a wait of up to 5 ms for more), so an idle encoder never
        waits for company and a busy one encodes many questions per model call."""
        self.inflight += 1
        try:
            if self.inflight == 1:
                (result,) = await asyncio.to_thread(self._encode_isolated, [question])
            else:
                result = await self.encode_batch(question)
        finally:
            self.inflight -= 1
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
    """Scatter/gather over a sharded index; ``describe`` and every result's coverage report the
    redundancy left ("1 of 2 replicas"); its health check reads the shards' replica counts again.

    ``index_cls(index_uri, index, app_name=, holder=)`` builds the index backend
    (:class:`serve.backend.IndexBackend`: ``search``, ``search_units``, ``retrieve_units``, ``liveness``,
    a ``manifest``, ``retire`` and ``release``); None: :class:`serve.index_app.ServeIndex`, the build's
    Serve application of shard deployments (shared by every Retriever replica).

    ``index_uri`` may be a build alias (:mod:`longrag.index.alias`), followed by
    :class:`serve.alias_switch.AliasSwitch` (:attr:`alias`): every ``index.refresh_s`` the replica
    re-reads its pointer and, on a new build, builds a second backend over it (its shards load beside
    the old ones), switches to it once every shard answers, lets the requests still running on the
    old build finish, then retires the old backend: its hold ends ``index.retire_after_s`` later, or
    when this replica stops if that comes first (``__del__`` releases every backend still retiring).
    A request runs on one build from start to end and its trace names it (``build_id``)."""

    def __init__(self, index_uri: str, index: IndexConfig, index_cls: IndexBackendFactory | None = None,
                 retrieval: RetrievalConfig | None = None) -> None:
        from serve.alias_switch import AliasSwitch

        if index_cls is None:
            from serve.index_app import ServeIndex

            index_cls = ServeIndex
        self.source, self.config, self.index_cls = index_uri, index, index_cls
        self.retrieval = retrieval or RetrievalConfig()
        self._uris: dict[str, str] = {}  # build id -> its uri, for the builds this replica opened
        self._graphs: dict[str, UnitGraph] = {}  # build id -> its unit graph, once a graph request read it
        self.alias = AliasSwitch(index_uri, self._open, refresh_s=index.refresh_s, check=self._check_dim,
                                 on_switch=self._switched, on_superseded=self._forget)
        self.live: list[ShardRedundancy] = [ShardRedundancy(shard=s, live=index.replicas, replicas=index.replicas)
                                            for s in range(len(self.manifest.shards))]

    @property
    def index(self) -> IndexBackend:
        """The backend of the build served now."""
        return self.alias.index

    @property
    def manifest(self) -> Manifest:
        """The manifest of the build served now."""
        return self.alias.index.manifest

    def _open(self, build_uri: str) -> IndexBackend:
        ctx = serve.get_replica_context()
        backend = self.index_cls(build_uri, self.config, app_name=ctx.app_name, holder=str(ctx.replica_id))
        self._uris[backend.manifest.build_id] = build_uri
        return backend

    async def retrieve(self, vector: np.ndarray, k: int, text: str | None = None, graph: bool = False) -> Retrieval:
        """The top ``k`` units for the question's vector; with its ``text``, the hybrid search (MaxP and
        BM25 fused, ``retrieval.hybrid_*``); with ``graph``, the first stage's top ``graph_depth``
        re-ranked with the units linked to its best ones (:func:`longrag.index.graph.expand`)."""
        self.alias.watch()
        trace: dict[str, Any] = {}
        with self.alias.using() as backend:  # this request finishes on the build it started on, even across a switch
            t0 = time.perf_counter()
            query = np.asarray(vector, dtype=np.float32)
            evidence_first = self.retrieval.scores_chunks
            if text is None and not graph:  # search and fetch together: one call per shard
                res, units = await backend.search_units(query, k, evidence_first)
                t1 = t2 = time.perf_counter()
            else:
                expansion = GraphExpansion.of(self.retrieval) if graph else None
                unit_graph = await self._unit_graph(backend) if graph else None
                depth = expansion.first_stage_k(k) if expansion else k
                res = await backend.search(query[None, :], depth, None if text is None else [text],
                                           Fusion.of(self.retrieval))
                hits = res.hits[0]
                if expansion is not None:
                    tg = time.perf_counter()
                    hits = expand(hits, unit_graph, k, expansion)
                    trace["graph_ms"] = round((time.perf_counter() - tg) * 1e3, 2)
                t1 = time.perf_counter()
                units = await backend.retrieve_units(hits, query if evidence_first or graph else None, evidence_first)
                t2 = time.perf_counter()
        if not self.retrieval.packs:
            for u in units:  # the chunks' scores travel on to the reader only to be packed by
                u.chunk_scores = None
        return Retrieval(units=units, coverage=res.coverage,
                         trace={"search_ms": round((t1 - t0) * 1e3, 2), "fetch_ms": round((t2 - t1) * 1e3, 2),
                                **trace, "shard_ms": res.shard_ms, "build_id": backend.manifest.build_id})

    async def _unit_graph(self, backend: IndexBackend) -> UnitGraph:
        """The unit link graph of ``backend``'s build, read once (the first graph request loads it)."""
        build_id = backend.manifest.build_id
        if build_id not in self._graphs:  # _forget() drops a retired build's
            from longrag.index.artifacts import ArtifactStore, require_unit_graph

            store = ArtifactStore.open(self._uris[build_id])
            self._graphs[build_id] = await asyncio.to_thread(require_unit_graph, store)
        return self._graphs[build_id]

    def _check_dim(self, build_uri: str) -> None:
        """The query encoder was checked against the build this replica started on (``QueryEncoder``): a
        build of another dimension is refused before its shards load."""
        from longrag.index.artifacts import ArtifactStore

        other = ArtifactStore.open(build_uri).read_manifest()
        if other.embedding.dim != self.manifest.embedding.dim:
            raise DimensionMismatch(
                f"build {other.build_id} ({build_uri}) holds {other.embedding.dim}-dimensional vectors, the query "
                f"encoder makes {self.manifest.embedding.dim}-dimensional ones (those of {self.manifest.build_id}): "
                "not switching; deploy the app again with the new build's embedding settings")

    async def _switched(self, new: IndexBackend) -> None:
        self.live = await new.liveness()

    def _forget(self, old: IndexBackend) -> None:
        """No request runs on ``old``'s build any more: what this replica read of it goes."""
        self._uris.pop(old.manifest.build_id, None)
        self._graphs.pop(old.manifest.build_id, None)

    async def refresh(self) -> str:
        """Follow the alias now; returns the build id served afterwards (:meth:`AliasSwitch.refresh`)."""
        return await self.alias.refresh()

    async def describe(self) -> IndexDescription:
        m = self.manifest
        self.live = await self.index.liveness()
        return IndexDescription(
            build_id=m.build_id, shards=len(m.shards), units=m.counts.units, chunks=m.counts.chunks,
            embedding_model=m.embedding.model,
            index=self.live,
        )

    async def check_health(self) -> None:
        """Read the shards' replica counts again (Serve replaces lost replicas itself). A shard
        without a running replica does not make this replica unhealthy (a new Retriever would find
        the same shards): requests keep being answered, with the shard named in their coverage, and
        /readyz reports it."""
        self.alias.watch()
        self.live = await self.index.liveness()

    async def __del__(self) -> None:
        """Serve's graceful shutdown: this replica's holds end, of the build it serves and of every
        superseded build still retiring (the alias moved less than ``index.retire_after_s`` ago);
        each index application goes with its last holder (:meth:`AliasSwitch.close`)."""
        alias = getattr(self, "alias", None)  # None: the constructor failed before it held anything
        if alias is not None:
            await alias.close()


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=8)
class LLMServer:
    """An in-process LLM behind a deployment; its calls run one at a time per replica.

    A call whose caller goes away (Serve cancels the request when its client disconnects or the
    ingress' deadline passes, and every handle call it made) is cancelled here too: the engine stops
    its work (llama.cpp: :mod:`longrag.llm.cancel`), and the call is counted (``cancelled``,
    ``longrag_llm_cancelled_calls``; the engine's tokens for them in ``longrag_llm_cancelled_tokens``).

    ``engine_cls(llm)`` builds the engine (any :class:`longrag.llm.base.LLM`), as ``engine_cls``
    does in ``ray.serve.llm``; None: :func:`serve.llm_handle.build_engine` (llama.cpp, an
    OpenAI-compatible server or a ``ray.serve.llm`` application's handle, per ``llm.backend``)."""

    def __init__(self, llm: LLMConfig, engine_cls: Callable[[LLMConfig], LLM] | None = None) -> None:
        if engine_cls is None:
            from serve.llm_handle import build_engine

            engine_cls = build_engine
        if llm.backend == "llamacpp" and llm.n_threads is None:
            # llama.cpp runs the CPUs this replica holds (Serve config's ray_actor_options or llm.num_cpus)
            from longrag.llm.threads import resolve_threads

            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
            llm = llm.model_copy(update={"n_threads": resolve_threads(None, cpus)})
        self.config = llm
        self.llm = engine_cls(llm)
        self.in_flight = 0
        self.cancelled = 0
        self._metrics: Any = None
        self._tokens_counted = 0

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        self.in_flight += 1
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            self._count_cancelled()
            raise
        finally:
            self.in_flight -= 1

    def _engine_cancelled(self) -> dict[str, int]:
        stats = getattr(self.llm, "cancel_stats", None)
        return stats() if callable(stats) else {}

    def _count_cancelled(self) -> None:
        """Ray counters of cancelled calls (and the engine's tokens for them), made on first use."""
        try:
            if self._metrics is None:
                from ray.util.metrics import Counter

                self._metrics = (Counter("longrag_llm_cancelled_calls", "LLM calls cancelled before they finished."),
                                 Counter("longrag_llm_cancelled_tokens", "Tokens generated for LLM calls that were "
                                         "then cancelled (the engine's count, where it has one)."))
            calls, tokens = self._metrics
            calls.inc(1)
            generated = self._engine_cancelled().get("generated_tokens", 0)
            if generated > self._tokens_counted:
                tokens.inc(generated - self._tokens_counted)
                self._tokens_counted = generated
        except Exception:  # noqa: BLE001 - metrics never fail a call (outside Ray: none)
            log.debug("could not count a cancelled call", exc_info=True)

    async def chat(self, messages: list[dict[str, str]], max_tokens: int, temperature: float | None = None,
                   stop: list[str] | None = None, cache_prefix: str | None = None) -> ChatResult:
        with self._running():
            return await self.llm.chat(messages, max_tokens=max_tokens, temperature=temperature, stop=stop,
                                       cache_prefix=cache_prefix)

    async def complete(self, prompt: str, max_tokens: int, temperature: float | None = None,
                       stop: list[str] | None = None) -> ChatResult:
        with self._running():
            return await self.llm.complete(prompt, max_tokens=max_tokens, temperature=temperature, stop=stop)

    async def chat_json(self, messages: list[dict[str, str]], schema: dict[str, Any], max_tokens: int,
                        temperature: float | None = None) -> ChatResult:
        """:meth:`longrag.llm.base.LLM.chat_json` (the dual filter's constrained judgements)."""
        with self._running():
            return await self.llm.chat_json(messages, schema=schema, max_tokens=max_tokens, temperature=temperature)

    async def stream_chat(self, messages: list[dict[str, str]], max_tokens: int, temperature: float | None = None,
                          stop: list[str] | None = None,
                          cache_prefix: str | None = None) -> AsyncIterator[str | ChatResult]:
        """:meth:`longrag.llm.base.LLM.stream_chat` over the handle (``handle.options(stream=True)``)."""
        with self._running():
            async for item in self.llm.stream_chat(messages, max_tokens=max_tokens, temperature=temperature,
                                                   stop=stop, cache_prefix=cache_prefix):
                yield item

    def describe(self) -> LLMDescription:
        return LLMDescription(name=self.llm.name, context_window=self.llm.context_window, in_flight=self.in_flight,
                              cancelled=self.cancelled, engine_cancelled=self._engine_cancelled())


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
        self.supports_json_schema = config.backend in ("llamacpp", "openai", "serve")

    async def chat(self, messages, *, max_tokens, temperature=None, stop=None,
                   cache_prefix=None) -> ChatResult:
        # cache_prefix by keyword: the LLMServer's router reads it (serve.routing.UnitAffinityRouter)
        return await self.handle.chat.remote(messages, max_tokens, temperature, stop, cache_prefix=cache_prefix)

    async def complete(self, prompt, *, max_tokens, temperature=None, stop=None) -> ChatResult:
        return await self.handle.complete.remote(prompt, max_tokens, temperature, stop)

    async def stream_chat(self, messages, *, max_tokens, temperature=None, stop=None,
                          cache_prefix=None):
        stream = self.handle.options(stream=True).stream_chat.remote(messages, max_tokens, temperature, stop,
                                                                     cache_prefix=cache_prefix)
        async for item in stream:
            yield item

    async def chat_json(self, messages, *, schema, max_tokens, temperature=None) -> ChatResult:
        return await self.handle.chat_json.remote(messages, schema, max_tokens, temperature)

    def count_tokens(self, text: str) -> int:
        return self._count(text)

    def truncate_tokens(self, text: str, n: int) -> str:
        truncate = getattr(self._count, "truncate", None)
        return truncate(text, n) if truncate is not None else super().truncate_tokens(text, n)


def local_token_counter(config: LLMConfig) -> Callable[[str], int]:
    """Token counting without the model's weights: llama.cpp loads the GGUF vocabulary only
    (:class:`longrag.llm.vocab.LlamaVocab`, which also truncates; no engine code); an OpenAI-compatible server's
    (or a ray.serve.llm app's) tokenizer is not reachable, so its counts are estimates."""
    if config.backend == "llamacpp":
        from longrag.llm.vocab import LlamaVocab

        return LlamaVocab.shared(config.model)
    from longrag.llm.openai_http import estimate_tokens

    return estimate_tokens


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=32)
class Reader:
    def __init__(self, llm_handle: DeploymentHandle, llm: LLMConfig, reader: ReaderConfig,
                 mixpr: MixPRConfig | None = None) -> None:
        from functools import partial

        from longrag.reading.longcontext import compress_units_with_mixpr
        from longrag.reading.reader import LongReader

        self.llm_handle = llm_handle
        self.llm = RemoteLLM(llm_handle, llm)
        self._window_known = False
        compressor = partial(compress_units_with_mixpr, cfg=mixpr or MixPRConfig())
        self.reader = LongReader(self.llm, reader, compressor=compressor)

    async def _know_window(self) -> None:
        if not self._window_known:
            # The window the LLM really has (llama.cpp clamps n_ctx to the model's trained context);
            # asked on first use because a replica's constructor must not block on another deployment.
            self.llm.context_window = (await self.llm_handle.describe.remote()).context_window
            self._window_known = True

    async def read(self, question: str, units: list[Unit], compression: str | None = None,
                   long_answer: bool | None = None) -> ReaderResult:
        await self._know_window()
        return await self.reader.read(question, units, compression, long_answer)

    async def read_stream(self, question: str, units: list[Unit], compression: str | None = None,
                          long_answer: bool | None = None) -> AsyncIterator[str | ShortAnswer | ReaderResult]:
        """:meth:`longrag.reading.reader.LongReader.read_stream`: the short answer as soon as it is
        ready, the long answer's deltas, then the result."""
        await self._know_window()
        async for item in self.reader.read_stream(question, units, compression, long_answer):
            yield item
