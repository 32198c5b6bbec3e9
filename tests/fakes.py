"""Deterministic test doubles. For unit tests only: every pipeline is also run with a real model."""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable

from longrag.llm.base import LLM, ChatResult, ContextOverflowError, check_max_tokens, check_messages

Reply = str | Callable[[list[dict]], str]


class ScriptedLLM(LLM):
    """Answers calls with scripted replies, in order, and records what it was sent.

    A reply is a string or a function of the messages. When the script runs out it repeats
    ``default``. Tokens are whitespace words, so tests can compute budgets by hand.
    """

    def __init__(
        self,
        replies: list[Reply] | None = None,
        *,
        context_window: int = 4096,
        default: str = "",
        name: str = "scripted",
        is_chat_model: bool = True,
    ) -> None:
        self.replies = list(replies or [])
        self.default = default
        self.context_window = context_window
        self.name = name
        self.is_chat_model = is_chat_model
        self.calls: list[dict] = []  # {"kind", "messages"|"prompt", "max_tokens", "temperature", "stop"}

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def count_message_tokens(self, messages: list[dict]) -> int:
        return sum(self.count_tokens(m["content"]) for m in messages)

    def _next(self, arg) -> str:
        reply = self.replies.pop(0) if self.replies else self.default
        return reply(arg) if callable(reply) else reply

    def _result(self, prompt_tokens: int, text: str, max_tokens: int) -> ChatResult:
        words = text.split(" ")
        if len(text.split()) > max_tokens:  # honour max_tokens like a real model would
            text = " ".join(words[:max_tokens])
        return ChatResult(text, prompt_tokens, self.count_tokens(text), 0.0, self.name)

    async def chat(self, messages, *, max_tokens, temperature=None, stop=None, cache_prefix=None) -> ChatResult:
        check_messages(messages)
        check_max_tokens(max_tokens)
        self.calls.append(
            dict(kind="chat", messages=copy.deepcopy(messages), max_tokens=max_tokens, temperature=temperature, stop=stop,
                 cache_prefix=cache_prefix)
        )
        prompt_tokens = self.count_message_tokens(messages)
        if prompt_tokens + max_tokens > self.context_window:
            raise ContextOverflowError(
                f"{prompt_tokens} + {max_tokens} tokens exceed the window of {self.context_window}"
            )
        return self._result(prompt_tokens, self._next(messages), max_tokens)

    async def stream_chat(self, messages, *, max_tokens, temperature=None, stop=None, cache_prefix=None):
        """The scripted reply streamed word by word (each delta a word with its leading space)."""
        res = await self.chat(messages, max_tokens=max_tokens, temperature=temperature, stop=stop,
                              cache_prefix=cache_prefix)
        for i, word in enumerate(res.text.split(" ")):
            yield word if i == 0 else " " + word
        yield res

    async def complete(self, prompt, *, max_tokens, temperature=None, stop=None) -> ChatResult:
        check_max_tokens(max_tokens)
        self.calls.append(dict(kind="complete", prompt=prompt, max_tokens=max_tokens, temperature=temperature, stop=stop))
        prompt_tokens = self.count_tokens(prompt)
        if prompt_tokens + max_tokens > self.context_window:
            raise ContextOverflowError(
                f"{prompt_tokens} + {max_tokens} tokens exceed the window of {self.context_window}"
            )
        return self._result(prompt_tokens, self._next(prompt), max_tokens)


# ---------------------------------------------------------------------------- Serve backends
# Fakes for the injectable backends of serve/deployments.py (encoder_cls, index_cls, engine_cls):
# the fast Serve tests (tests/serve/test_app_fakes.py) run the real deployments, ingress and
# ShardedIndex code over them; tests/serve/test_app.py runs the same app with the real models.


class HashEncoder:
    """A model-free query encoder: hashed bag of lower-cased words, L2-normalized. Questions that
    share words with a unit's text score high on it, which is all a routing test needs."""

    dim = 64

    def __init__(self, embedding=None) -> None:
        self.embedding = embedding

    def encode_queries(self, texts: list[str]):
        import zlib

        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            text.encode("utf-8")  # a lone surrogate fails here, as in a real tokenizer
            for word in re.findall(r"[a-z0-9]+", text.lower()):
                out[i, zlib.crc32(word.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)

    encode_passages = encode_queries


def write_tiny_build(root, docs: list[tuple[str, str]], shards: int = 2,
                     links: list[tuple[int, int]] | None = None) -> str:
    """A complete build (manifest, shards with units, chunks and MaxP indexes) of one unit per
    ``(title, text)``, one chunk per sentence, embedded with :class:`HashEncoder`; no Ray. With
    ``links`` (pairs of positions in ``docs``), the unit link graph too."""
    from longrag.config import LongRAGConfig
    from longrag.index.artifacts import ArtifactStore, write_shard
    from longrag.index.manifest import Manifest
    from longrag.index.maxp import MaxPIndex
    from longrag.types import Chunk, Unit

    store = ArtifactStore.open(str(root))
    manifest = Manifest.create(LongRAGConfig(), dim=HashEncoder.dim, documents=len(docs))
    units, chunks = [], []
    for i, (title, text) in enumerate(docs):
        uid = f"u{i:03d}"
        units.append(Unit(unit_id=uid, doc_ids=[str(i)], titles=[title], text=text, n_tokens=len(text.split())))
        for j, sentence in enumerate(s for s in re.split(r"(?<=\.)\s+", text) if s):
            chunks.append(Chunk(chunk_id=f"{uid}:{j:04d}", unit_id=uid, position=j, text=sentence,
                                n_tokens=len(sentence.split())))
    for s in range(shards):
        shard_units = [u for i, u in enumerate(units) if i % shards == s]
        ids = {u.unit_id for u in shard_units}
        shard_chunks = [c for c in chunks if c.unit_id in ids]
        vectors = HashEncoder().encode_passages([f"{c.text}" for c in shard_chunks])
        index = MaxPIndex.build(vectors, [c.chunk_id for c in shard_chunks], [c.unit_id for c in shard_chunks])
        manifest.add_shard(write_shard(store, s, shard_units, shard_chunks, index))
    if links is not None:
        import numpy as np

        from longrag.index.artifacts import write_unit_graph
        from longrag.index.graph import GRAPH_FILE, unit_graph_from_labels

        graph = unit_graph_from_labels([u.unit_id for u in units], [i % shards for i in range(len(units))],
                                       np.arange(len(units)), np.array([a for a, _ in links], dtype=np.int64),
                                       np.array([b for _, b in links], dtype=np.int64))
        manifest.artifacts[GRAPH_FILE] = write_unit_graph(store, graph)
    manifest.mark_complete()
    store.write_manifest(manifest)
    return str(root)


class _Response:
    """What ``handle.method.remote()`` returns, as Serve's ``DeploymentResponse``: awaitable, with ``cancel()``."""

    def __init__(self, router: _FakeDeployment, method: str, args) -> None:
        self.router, self.method, self.args = router, method, args

    def __await__(self):
        return self.router.call(self.method, self.args).__await__()

    def cancel(self) -> None:
        pass


class _FakeDeployment:
    """A shard deployment's handle in process: replicas wrapping the real ``IndexShardImpl``, routed
    round robin as Serve's router does; a dead replica fails the call that meets it (an actor died)
    and is then left out, as Serve's router leaves out a replica whose actor died; a flaky one
    fails searches with ``k == FLAKY_K`` and stays in (its health checks pass)."""

    class _Method:
        def __init__(self, router: _FakeDeployment, name: str) -> None:
            self.router, self.name = router, name

        def remote(self, *args):
            return _Response(self.router, self.name, args)

    def __init__(self, impl, n: int, dead: set[int], flaky: set[int]) -> None:
        self.impl, self.n, self.dead, self.flaky = impl, n, set(dead), set(flaky)
        self.routed = list(range(n))
        self._next: dict[str, int] = {}  # round robin per method, so searches meet every replica in turn

    def __getattr__(self, name: str):
        return self._Method(self, name)

    async def call(self, method: str, args):
        if not self.routed:
            raise RuntimeError("no running replica of this shard (a test fake)")
        i = self._next[method] = self._next.get(method, -1) + 1
        r = self.routed[i % len(self.routed)]
        if r in self.dead:
            self.routed.remove(r)
            raise RuntimeError("ActorDiedError: this replica is dead (a test fake)")
        if r in self.flaky and method in ("search", "search_units") and args[1] == FLAKY_K:
            raise RuntimeError(f"a flaky replica (a test fake): searches with k={FLAKY_K} fail")
        return getattr(self.impl, method)(*args)


FLAKY_K = 11  # a flaky replica (FakeShardsIndex.flaky) fails searches with this k and answers everything else


class FakeShardsIndex:
    """An index backend for the ``Retriever`` that keeps the scatter/gather layer: the real
    ``ShardedIndex`` (retries, coverage, MaxP merge) over fake shard deployments wrapping the real
    ``IndexShardImpl`` in process, so replicas can be made dead or flaky. (The product's own
    in-process backend, without replicas, is ``actors.inprocess_index.InProcessIndex``.) ``dead``
    names ``(shard, replica)`` pairs that fail their first call and count as not running."""

    dead: frozenset = frozenset()
    flaky: frozenset = frozenset()

    def __init__(self, index_uri: str, config, *, app_name: str = "", holder: str = "") -> None:
        from actors.index_shard import IndexShardImpl
        from actors.sharded_index import ShardedIndex
        from longrag.index.artifacts import ArtifactStore

        self.manifest = ArtifactStore.open(index_uri).read_manifest()
        handles = [_FakeDeployment(IndexShardImpl(index_uri, s.shard_id), config.replicas,
                                   {r for sh, r in self.dead if sh == s.shard_id},
                                   {r for sh, r in self.flaky if sh == s.shard_id}) for s in self.manifest.shards]

        class Counted(ShardedIndex):
            async def replica_counts(self):
                return [(h.n - len(h.dead), h.n) for h in self.handles]

        self.index = Counted(handles, timeout_s=config.search_timeout_s, manifest=self.manifest,
                             replicas=config.replicas)
        self.index.counts = [(h.n - len(h.dead), h.n) for h in handles]

    @classmethod
    def with_dead(cls, *pairs: tuple[int, int]) -> type:
        """A subclass whose given ``(shard, replica)`` replicas are dead."""
        return type("FakeShardsIndexWithDead", (cls,), {"dead": frozenset(pairs), "__module__": __name__})

    @classmethod
    def with_flaky(cls, *pairs: tuple[int, int]) -> type:
        """A subclass whose given ``(shard, replica)`` replicas fail searches with ``k == FLAKY_K``."""
        return type("FakeShardsIndexWithFlaky", (cls,), {"flaky": frozenset(pairs), "__module__": __name__})

    async def search(self, queries, k: int, texts=None, fusion=None):
        return await self.index.search(queries, k, texts, fusion)

    async def retrieve_units(self, hits, query=None, evidence: bool = True):
        return await self.index.retrieve_units(hits, query, evidence)

    async def search_units(self, query, k: int, evidence: bool = False):
        return await self.index.search_units(query, k, evidence)

    async def liveness(self):
        return await self.index.liveness()

    async def release(self) -> None:
        pass

    async def retire(self) -> None:
        pass


def _first_title(text: str) -> str:
    m = re.search(r"Title: ([^\n;]+)", text)
    return m.group(1).strip() if m else "unknown"


class TitleReader(ScriptedLLM):
    """An LLM engine for ``LLMServer(engine_cls=TitleReader)``: the long answer names the first
    document's title ("The documents say: <title>."), the short answer (turn 2, or the direct prompt) is the
    title."""

    def __init__(self, config=None) -> None:
        def reply(messages: list[dict]) -> str:
            text = messages[1]["content"] if len(messages) > 1 else messages[-1]["content"]
            title = _first_title(text)
            short = len(messages) > 2 or "Reply with only the answer" in messages[-1]["content"]
            return title if short else f"The documents say: {title}."

        super().__init__(default=reply, name="title-reader", context_window=8192)


# ---------------------------------------------------------------------------- faults (tests/serve/test_faults.py)
# Backends that misbehave on a marker in the question, so one app serves both the normal requests
# and the faulty ones: a stage that sleeps past its deadline, an LLM that raises or whose replica
# process dies while an answer is in flight.
SLEEP_S = 12.0  # longer than every stage deadline of the faults app (tests/serve/test_faults.py)
ENCODE_SLEEP_S = 3.0  # just past its encode deadline: the encoder's batch loop waits for it


class SleepyEncoder(HashEncoder):
    """Sleeps ``ENCODE_SLEEP_S`` on a question containing ``[slow-encode]``."""

    def encode_queries(self, texts: list[str]):
        import time

        if any("[slow-encode]" in t for t in texts):
            time.sleep(ENCODE_SLEEP_S)
        return super().encode_queries(texts)


SLOW_K = 13  # a retrieve with this k sleeps (the index sees vectors, not questions)


class SleepyIndex(FakeShardsIndex):
    """Sleeps on a search with ``k == SLOW_K``; replica 0 of shard 0 is flaky (see ``FLAKY_K``)."""

    flaky = frozenset({(0, 0)})

    async def search(self, queries, k: int, texts=None, fusion=None):
        import asyncio

        if k == SLOW_K:
            await asyncio.sleep(SLEEP_S)
        return await super().search(queries, k, texts, fusion)

    async def search_units(self, query, k: int, evidence: bool = False):
        import asyncio

        if k == SLOW_K:
            await asyncio.sleep(SLEEP_S)
        return await super().search_units(query, k, evidence)


class FaultyReader(TitleReader):
    """:class:`TitleReader` whose calls misbehave on a marker in the messages:

    * ``[slow-read]``: sleeps ``SLEEP_S``;
    * ``[fail-once:ID]``: raises ``LLMError`` the first time it sees ``ID`` (in this replica), then answers;
    * ``[fail-always]``: raises ``LLMError`` every time;
    * ``[fail-mid-stream]``: a stream raises after its first two deltas;
    * ``[die]``: the LLMServer replica's process exits (``os._exit``) in the middle of the call.
    """

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.failed: set[str] = set()

    async def _misbehave(self, messages) -> None:
        import asyncio
        import os

        from longrag.llm.base import LLMError

        text = " ".join(m.get("content", "") for m in messages) if isinstance(messages, list) else str(messages)
        if "[slow-read]" in text or "[slow-dual]" in text:
            await asyncio.sleep(SLEEP_S)
        if "[die]" in text:
            os._exit(1)
        if "[fail-always]" in text:
            raise LLMError("the engine failed (a test fault: [fail-always])")
        for marker in re.findall(r"\[fail-once:\w+\]", text):
            if marker not in self.failed:
                self.failed.add(marker)
                raise LLMError(f"the engine failed (a test fault: {marker})")

    async def chat(self, messages, *, max_tokens, temperature=None, stop=None, cache_prefix=None):
        await self._misbehave(messages)
        return await super().chat(messages, max_tokens=max_tokens, temperature=temperature, stop=stop,
                                  cache_prefix=cache_prefix)

    async def chat_json(self, messages, *, schema, max_tokens, temperature=None):
        await self._misbehave(messages)
        return await super().chat_json(messages, schema=schema, max_tokens=max_tokens, temperature=temperature)

    async def stream_chat(self, messages, *, max_tokens, temperature=None, stop=None, cache_prefix=None):
        text = " ".join(m.get("content", "") for m in messages)
        n = 0
        async for item in super().stream_chat(messages, max_tokens=max_tokens, temperature=temperature, stop=stop,
                                              cache_prefix=cache_prefix):
            if "[fail-mid-stream]" in text and n == 2:
                from longrag.llm.base import LLMError

                raise LLMError("the engine failed mid-stream (a test fault: [fail-mid-stream])")
            n += 1
            yield item


def faults_app(args: dict):
    """Serve app builder (``import_path: tests.fakes:faults_app``) of the app over the faulty fakes:
    ``args`` = ``{"index": build, "overrides": [...]}``."""
    from longrag.config import LongRAGConfig
    from serve.app import build_app

    cfg = LongRAGConfig().with_overrides(list(args.get("overrides", [])))
    return build_app(cfg, args["index"], encoder_cls=SleepyEncoder, index_cls=SleepyIndex, engine_cls=FaultyReader)


# ---------------------------------------------------------------------------- the app over fakes
@contextlib.contextmanager
def serve_fake_app(build: str, port: int, overrides: list[str] | None = None, *, name: str = "longrag"):
    """A local Ray (4 logical CPUs, no dashboard) with the repository on the workers' path, Serve on
    127.0.0.1:``port`` and the real app over the plain fakes (:class:`HashEncoder`, :class:`FakeShardsIndex`,
    :class:`TitleReader`) of ``build``, configured by ``overrides``; yields the base URL once the app is
    RUNNING; shuts Serve and Ray down on exit."""
    import os
    from pathlib import Path

    import ray
    from ray import serve

    from cluster.local import WORKER_ENV
    from longrag.config import LongRAGConfig
    from serve.app import build_app
    from serve.run import wait_running

    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=4, include_dashboard=False, namespace="longrag",
             runtime_env={"env_vars": {**WORKER_ENV, "PYTHONPATH": path}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        cfg = LongRAGConfig().with_overrides(list(overrides or []))
        app = build_app(cfg, build, encoder_cls=HashEncoder, index_cls=FakeShardsIndex, engine_cls=TitleReader)
        serve.run(app, name=name, route_prefix="/", blocking=False)
        assert wait_running([name], ready_timeout_s=180) is None
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


class ReplicaNamer(ScriptedLLM):
    """An LLM engine that answers with the id of the Serve replica it runs in (``ChatResult.text``):
    which replica a call was routed to (tests/serve/test_app_fakes.py, serve.routing)."""

    def __init__(self, config=None) -> None:
        def reply(messages: list[dict]) -> str:
            from ray import serve

            return serve.get_replica_context().replica_id.unique_id

        super().__init__(default=reply, name="replica-namer", context_window=8192)
