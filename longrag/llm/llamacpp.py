"""In-process llama.cpp backend (llama-cpp-python): the CPU default with a bundled GGUF model.

``model`` is a bundled model name (see :mod:`longrag.models.bundled`: the default reader
``qwen2.5-coder-0.5b-instruct``, ``smollm2-135m-instruct``, ``gemma3-270m``) or a path to a ``.gguf``
file. A GGUF without a chat template gets ``chat_format`` (e.g. ``chatml``); bundled models carry theirs.
``lora_path`` applies a LoRA adapter GGUF on top of the model (``python -m jobs.finetune`` writes one,
see :func:`longrag.llm.convert.lora_to_gguf`).

A llama.cpp context is not thread-safe: every call runs in a worker thread under one lock, so
concurrent requests queue instead of corrupting state. A call whose awaiting task is cancelled (its
client went away, its deadline passed) stops: refused while it waits for the lock, aborted within
one llama.cpp graph node while it runs (:mod:`longrag.llm.cancel`), the context reset and counted in
:meth:`LlamaCppLLM.cancel_stats`.
Consecutive calls that share a prompt prefix (the reader's second turn repeats the first turn's
conversation) reuse llama.cpp's KV cache for that prefix: only the new tokens are evaluated. With
``prompt_cache_mb`` the KV states of recent calls are kept in RAM, so that holds when other requests
ran in between, as they do behind a Serve deployment.

Models still open when the interpreter exits are closed by an ``atexit`` hook, while llama.cpp's
module is whole: left to ``Llama.__del__`` during finalization they free half their state (the
binding's globals are already gone) or none.

This module is the engine: loading, the lock, cancellation, generation. Beside it, each for those
who need it without the engine: :mod:`longrag.llm.vocab` (counting and cutting in the model's
tokens), :mod:`longrag.llm.threads` (how many threads), :mod:`longrag.llm.prefix` (the unit cache's
keys and states in and out of a context) and :mod:`longrag.llm.memory` (the binding's logits
buffers, bounded). ``resolve_threads`` and ``resolve_model_path`` are importable from here too, where
jobs have always taken them.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from longrag.llm.base import (
    LLM,
    ChatResult,
    ContextOverflowError,
    LLMError,
    check_max_tokens,
    check_messages,
    check_prompt,
    resolve_temperature,
)
from longrag.llm.cancel import AbortSwitch, CancelToken, LLMCancelled
from longrag.llm.kvcache import PrefixStateCache
from longrag.llm.memory import make_ram_cache, one_row_of_logits
from longrag.llm.prefix import chat_formatter, common_prefix, hold_prefix, prefix_key, prefix_key_base, state_params
from longrag.llm.threads import resolve_threads
from longrag.llm.vocab import LlamaVocab
from longrag.models.bundled import BUNDLED_MODELS, DEFAULT_READER_MODEL, BundledModel, file_sha256, resolve_model_path

__all__ = ["BUNDLED_MODELS", "BundledModel", "LlamaCppLLM", "resolve_model_path", "resolve_threads"]

log = logging.getLogger(__name__)

_OPEN: weakref.WeakSet[LlamaCppLLM] = weakref.WeakSet()


@atexit.register
def _close_open_models() -> None:
    for model in list(_OPEN):
        model.close()


class LlamaCppLLM(LLM):
    """llama.cpp in process.

    ``n_ctx`` is clamped to the model's trained context; ``n_threads=None`` runs every CPU the process
    may use (:func:`resolve_threads`; a Serve replica passes its own CPUs).
    Token counts in results are the model's own (from llama.cpp's ``usage``).
    """

    def __init__(
        self,
        model: str = DEFAULT_READER_MODEL,
        *,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        seed: int = 0,
        temperature: float = 0.0,
        n_batch: int = 512,
        chat_format: str | None = None,
        flash_attn: bool = True,
        prompt_cache_mb: int = 0,
        lora_path: str | None = None,
        lora_scale: float = 1.0,
        unit_cache: PrefixStateCache | None = None,
        min_cached_prefix_tokens: int = 32,
    ) -> None:
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        n_threads = resolve_threads(n_threads)
        try:
            from llama_cpp import Llama
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise LLMError("the llamacpp backend needs llama-cpp-python (pip install llama-cpp-python)") from e

        self.model_path = resolve_model_path(model)
        bundled = BUNDLED_MODELS.get(model)
        self.is_chat_model = bundled.chat if bundled else True  # paths: decided from the GGUF below
        self.name = model if bundled else self.model_path.stem
        self.temperature = float(temperature)
        self.seed = int(seed)
        self._lock = threading.Lock()
        kwargs: dict[str, Any] = dict(
            model_path=str(self.model_path),
            n_ctx=n_ctx,
            n_batch=min(n_batch, n_ctx),
            seed=self.seed,
            flash_attn=flash_attn,
            verbose=False,
        )
        chat_format = chat_format or (bundled.chat_format if bundled else None)
        if chat_format:
            kwargs["chat_format"] = chat_format
        kwargs["n_threads"] = n_threads  # generation
        kwargs["n_threads_batch"] = n_threads  # prompt evaluation
        if lora_path:
            lora = Path(lora_path).expanduser()
            if not lora.is_file() or lora.suffix != ".gguf":
                raise LLMError(f"lora_path {lora_path!r} is not a LoRA adapter .gguf file (see python -m jobs.finetune)")
            kwargs["lora_path"] = str(lora)
            kwargs["lora_scale"] = float(lora_scale)
            self.name = f"{self.name}+{lora.parent.name if lora.stem == 'adapter' else lora.stem}"
        try:
            llama = Llama(**kwargs)
        except Exception as e:  # llama.cpp raises ValueError/RuntimeError on bad files
            raise LLMError(f"llama.cpp could not load {self.model_path}: {e}") from e
        import llama_cpp

        trained = int(llama_cpp.llama_model_n_ctx_train(llama.model)) or n_ctx
        if n_ctx > trained:
            # Re-create with the clamped window: a larger one only wastes memory and misleads fitting.
            log.info("n_ctx %d > trained context %d of %s: clamping", n_ctx, trained, self.name)
            del llama
            kwargs["n_ctx"] = trained
            kwargs["n_batch"] = min(n_batch, trained)
            llama = Llama(**kwargs)
        one_row_of_logits(llama)
        if prompt_cache_mb > 0:
            # Saved KV states keyed by token prefix: a conversation's next turn finds its own prefix
            # again even when another request ran in between (llama.cpp keeps only the last one).
            llama.set_cache(make_ram_cache(prompt_cache_mb << 20))
        self._llama = llama
        self._abort = AbortSwitch(llama.ctx)
        self._calls = {"requests": 0, "refused_waiting": 0, "aborted_running": 0, "generated_tokens": 0,
                           "all_calls": 0, "all_generated_tokens": 0}
        self._vocab = LlamaVocab(llama, self._lock)
        _OPEN.add(self)
        self.context_window = int(llama.n_ctx())
        if bundled is None:  # a user's file: a chat model iff it has a chat template or format
            self.is_chat_model = bool(chat_format or (llama.metadata or {}).get("tokenizer.chat_template"))
        self.chat_format = chat_format
        self.n_threads = n_threads
        self.unit_cache = unit_cache
        self.min_cached_prefix_tokens = int(min_cached_prefix_tokens)
        self._formatter = chat_formatter(llama)
        if unit_cache is not None and self._formatter is None:
            log.warning("%s: chat format %r cannot be rendered here: the unit KV cache is off", self.name,
                        llama.chat_format)
        self._lora = (Path(lora_path).expanduser(), float(lora_scale)) if lora_path else None
        self._prefix_key_base: str | None = None
        self._model_sha256 = bundled.sha256 if bundled is not None else None  # pinned for assembled models

    # -- tokens -------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        """Exact token count with the model's own tokenizer (no BOS)."""
        return self._vocab(text)

    def truncate_tokens(self, text: str, n: int) -> str:
        return self._vocab.truncate(text, n)

    def tokenize(self, text: str) -> list[int]:
        return self._vocab.tokenize(text).tolist()

    def detokenize(self, tokens: list[int]) -> str:
        with self._lock:
            return self._llama.detokenize(tokens).decode("utf-8", errors="ignore")

    # -- generation ---------------------------------------------------------------------------

    def phase_counters(self) -> dict[str, float]:
        """llama.cpp's own counters of this context since it was made: prompt tokens evaluated and the
        milliseconds they took, tokens generated and theirs (a benchmark's tokens/s per phase)."""
        import llama_cpp

        with self._lock:
            if self._llama is None:
                raise LLMError(f"{self.name} is closed")
            perf = llama_cpp.llama_perf_context(self._llama.ctx)
            return {"prompt_tokens": int(perf.n_p_eval), "prompt_ms": float(perf.t_p_eval_ms),
                    "generated_tokens": int(perf.n_eval), "generate_ms": float(perf.t_eval_ms)}

    def _evaluated_tokens(self) -> tuple[int, int]:
        """Prompt tokens evaluated and tokens generated in this context so far (llama.cpp's counters)."""
        import llama_cpp

        perf = llama_cpp.llama_perf_context(self._llama.ctx)
        return int(perf.n_p_eval), int(perf.n_eval)

    def cancel_stats(self) -> dict[str, int]:
        """Calls cancelled since the model was made: ``requests`` in all, ``refused_waiting`` (while
        waiting for the model, or before they started), ``aborted_running`` (stopped mid-evaluation
        or mid-generation), and the ``generated_tokens`` written for them before they stopped; beside
        them ``all_calls`` and ``all_generated_tokens``, every call's (the share wasted is the ratio).
        Read without the model's lock: a running call is counted when it ends."""
        return dict(self._calls)

    def _acquire(self, cancel: CancelToken | None, what: str) -> None:
        """The model's lock; a call cancelled while it waits gives up its place at once."""
        if cancel is None:
            self._lock.acquire()
            return
        while not self._lock.acquire(timeout=0.05):
            if cancel.cancelled:
                self._count_cancelled("refused_waiting")
                raise LLMCancelled(f"{self.name}: the {what} was cancelled while it waited for the model")

    def _count_cancelled(self, how: str, generated: int = 0) -> None:
        self._calls["requests"] += 1
        self._calls[how] += 1
        self._calls["generated_tokens"] += generated

    def _run(self, fn, what: str, cancel: CancelToken | None = None) -> Any:
        """Run ``fn`` under the lock; returns (its result, prompt tokens it evaluated). A call
        whose ``cancel`` token is cancelled stops (:mod:`longrag.llm.cancel`): the context is reset
        (llama.cpp keeps the batches it finished) and :class:`LLMCancelled` raised."""
        self._acquire(cancel, what)
        try:
            if self._llama is None:
                raise LLMError(f"{self.name} is closed")
            if cancel is not None and cancel.cancelled:
                self._count_cancelled("refused_waiting")
                raise LLMCancelled(f"{self.name}: the {what} was cancelled before it ran")
            if self.cold_reads:
                self._forget_locked()
            before = self._evaluated_tokens()
            self._calls["all_calls"] += 1
            try:
                with self._abort.bound(cancel, what):
                    return fn(), self._evaluated_tokens()[0] - before[0]
            except ValueError as e:
                msg = str(e)
                if "context window" in msg or "n_ctx" in msg:
                    raise ContextOverflowError(
                        f"{self.name}: prompt does not fit the context window of {self.context_window} tokens ({msg})"
                    ) from e
                raise LLMError(f"{self.name} {what} failed: {msg}") from e
            except RuntimeError as e:
                if cancel is not None and cancel.cancelled:
                    self._count_cancelled("aborted_running", self._evaluated_tokens()[1] - before[1])
                    self._llama.reset()  # the aborted batch's tokens are not the context's
                    raise LLMCancelled(f"{self.name}: the {what} was cancelled while it ran") from None
                raise LLMError(f"{self.name} {what} failed: {e}") from e
            finally:
                if self._llama is not None:
                    self._calls["all_generated_tokens"] += self._evaluated_tokens()[1] - before[1]
        finally:
            self._lock.release()

    async def _in_thread(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, cancel=token, **kwargs)`` in a worker thread; when the awaiting task is
        cancelled, so is the call (it stops at llama.cpp's next graph node, or never starts)."""
        token = CancelToken()
        worker = asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, cancel=token, **kwargs))
        worker.add_done_callback(_retrieved)  # a cancelled call's LLMCancelled has no reader
        try:
            return await asyncio.shield(worker)
        except asyncio.CancelledError:
            token.cancel()
            raise

    def _temperature(self, temperature: float | None) -> float:
        return resolve_temperature(self.temperature, temperature)

    def _result(self, out: dict, evaluated: int, text: str, t0: float) -> ChatResult:
        usage = out.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens", 0))
        return ChatResult(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=int(usage.get("completion_tokens", 0)),
            latency_ms=(time.perf_counter() - t0) * 1000.0,
            model=self.name,
            # llama.cpp evaluates at least the last prompt token again even on a full cache hit
            cached_prompt_tokens=max(0, prompt_tokens - evaluated),
        )

    def chat_sync(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
        response_format: dict | None = None,
        cache_prefix: str | None = None,
        cancel: CancelToken | None = None,
    ) -> ChatResult:
        """Blocking chat (what :meth:`chat` runs in a thread). ``response_format``
        ``{"type": "json_object", "schema": {...}}`` constrains decoding with a grammar built from the
        schema (llama-cpp-python's own conversion). ``cache_prefix``: see :meth:`_use_prefix`;
        ``cancel``: the call stops when it is cancelled (:class:`LLMCancelled`)."""
        check_messages(messages)
        check_max_tokens(max_tokens)
        if not self.is_chat_model:
            raise LLMError(f"{self.name} is a base model without a chat template: use complete()")
        temp = self._temperature(temperature)
        t0 = time.perf_counter()
        def call() -> tuple[dict, str]:
            source = self._use_prefix(messages, cache_prefix)
            return self._llama.create_chat_completion(
                messages=[{"role": m["role"], "content": m["content"]} for m in messages],
                max_tokens=max_tokens,
                temperature=temp,
                stop=stop or None,
                seed=self.seed,
                response_format=response_format,
            ), source

        (out, source), evaluated = self._run(call, "chat", cancel)
        text = out["choices"][0]["message"].get("content") or ""
        return replace(self._result(out, evaluated, text, t0), prefix_cache=source)

    def complete_sync(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
        cancel: CancelToken | None = None,
    ) -> ChatResult:
        """Blocking plain completion (what :meth:`complete` runs in a thread)."""
        check_prompt(prompt)
        check_max_tokens(max_tokens)
        temp = self._temperature(temperature)
        t0 = time.perf_counter()
        out, evaluated = self._run(
            lambda: self._llama.create_completion(
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=temp,
                stop=stop or None,
                seed=self.seed,
            ),
            "completion",
            cancel,
        )
        return self._result(out, evaluated, out["choices"][0].get("text") or "", t0)

    async def chat(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
        cache_prefix: str | None = None,
    ) -> ChatResult:
        return await self._in_thread(
            self.chat_sync, messages, max_tokens=max_tokens, temperature=temperature, stop=stop,
            cache_prefix=cache_prefix,
        )

    async def stream_chat(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
        cache_prefix: str | None = None,
    ) -> AsyncIterator[str | ChatResult]:
        """``create_chat_completion(stream=True)`` in a worker thread, its deltas handed to the
        event loop as they come; the model's lock is held for the whole generation. A consumer that
        stops reading (closes the stream, or its task is cancelled) stops the generation."""
        check_messages(messages)
        check_max_tokens(max_tokens)
        if not self.is_chat_model:
            raise LLMError(f"{self.name} is a base model without a chat template: use complete()")
        temp = self._temperature(temperature)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        t0 = time.perf_counter()

        def generate() -> tuple[int, str]:
            source = self._use_prefix(messages, cache_prefix)
            pieces = self._llama.create_chat_completion(
                messages=[{"role": m["role"], "content": m["content"]} for m in messages],
                max_tokens=max_tokens, temperature=temp, stop=stop or None, seed=self.seed, stream=True,
            )
            for chunk in pieces:
                delta = chunk["choices"][0].get("delta", {}).get("content")
                if delta:
                    loop.call_soon_threadsafe(queue.put_nowait, delta)
            return int(self._llama.n_tokens), source

        token = CancelToken()

        def run() -> None:
            try:
                result = self._run(generate, "chat", token)
            except BaseException as exc:  # handed to the consumer, raised there
                result = exc
            loop.call_soon_threadsafe(queue.put_nowait, _Done(result))

        worker = loop.run_in_executor(None, run)
        parts: list[str] = []
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _Done):
                    finished = True
                    break
                parts.append(item)
                yield item
        finally:
            if not finished:
                token.cancel()  # the consumer stopped reading (closed or cancelled): stop generating
        await worker
        if isinstance(item.value, BaseException):
            raise item.value
        (in_context, source), evaluated = item.value
        text = "".join(parts)
        completion = self.count_tokens(text)
        prompt_tokens = max(0, in_context - completion)
        yield ChatResult(text=text, prompt_tokens=prompt_tokens, completion_tokens=completion,
                         latency_ms=(time.perf_counter() - t0) * 1000.0, model=self.name,
                         cached_prompt_tokens=max(0, prompt_tokens - evaluated), prefix_cache=source)

    supports_json_schema = True

    async def chat_json(
        self,
        messages: list[dict],
        *,
        schema: dict[str, Any],
        max_tokens: int,
        temperature: float | None = None,
    ) -> ChatResult:
        """Chat constrained to one JSON object matching ``schema`` (a llama.cpp grammar)."""
        if not isinstance(schema, dict):
            raise ValueError(f"schema must be a JSON schema dict, got {type(schema).__name__}")
        return await self._in_thread(
            self.chat_sync,
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            response_format={"type": "json_object", "schema": schema},
        )

    async def complete(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> ChatResult:
        return await self._in_thread(
            self.complete_sync, prompt, max_tokens=max_tokens, temperature=temperature, stop=stop
        )

    # -- the unit KV cache ----------------------------------------------------------------------

    def chat_prompt_tokens(self, messages: list[dict]) -> list[int]:
        """The tokens ``create_chat_completion`` evaluates for ``messages`` (the chat format's prompt,
        tokenized as llama-cpp-python's formatter handler does). Needs the unit cache's formatter."""
        if self._formatter is None:
            raise LLMError(f"{self.name}: no chat formatter (the unit cache is off)")
        res = self._formatter(messages=[{"role": m["role"], "content": m["content"]} for m in messages])
        return list(self._llama.tokenize(res.prompt.encode("utf-8"), add_bos=not res.added_special, special=True))

    def _use_prefix(self, messages: list[dict], cache_prefix: str | None) -> str:
        """Before a chat call, under the lock: put the KV state of the prompt's ``cache_prefix`` in
        the context, from the unit cache ("ram", "disk") or, on a miss, by evaluating exactly the
        prefix's tokens and storing their state ("miss"); "context" when the context already holds
        them; "" when there is nothing to do (no prefix, a cold read, a short prefix) or no cache.
        This method picks the tokens; :func:`longrag.llm.prefix.hold_prefix` puts their state in.

        The prefix's tokens are the prompt's own: the common token prefix of the whole prompt and of
        the same conversation cut after ``cache_prefix``. A stored state is loaded only when its
        token ids equal them, and llama.cpp then evaluates the rest of the prompt as it would after
        any prefix it holds. Without a cache the prefix is still evaluated first, then the rest: a
        prompt is evaluated in the same batches with the cache on, off, hit or missed, so its
        logits are the same to the bit and greedy answers never depend on the cache (one whole
        evaluation differs from a split one in the last bits of its sums)."""
        if self._formatter is None or not cache_prefix or self.cold_reads:
            return ""
        last = messages[-1]
        if last["role"] != "user" or not last["content"].startswith(cache_prefix):
            return ""
        full = self.chat_prompt_tokens(messages)
        head = self.chat_prompt_tokens(messages[:-1] + [{"role": "user", "content": cache_prefix}])
        n = min(common_prefix(full, head), len(full) - 1)  # llama.cpp evaluates the last token again
        if n < self.min_cached_prefix_tokens:
            return ""
        return hold_prefix(self._llama, np.asarray(full[:n], dtype=np.int32), self.unit_cache, self._prefix_key,
                           self.name)

    def _prefix_key(self, prefix: np.ndarray) -> str:
        """:func:`longrag.llm.prefix.prefix_key` of :func:`~longrag.llm.prefix.prefix_key_base` (the
        model, adapter, chat format, binding and context layout: fixed for the life of the context,
        so computed once) and of the prefix's token ids."""
        if self._prefix_key_base is None:
            import llama_cpp

            model_sha = self._model_sha256 or file_sha256(self.model_path)
            lora = f"{file_sha256(self._lora[0])}:{self._lora[1]}" if self._lora else "-"
            self._prefix_key_base = prefix_key_base(
                model_sha256=model_sha, lora=lora, chat_format=self._llama.chat_format,
                binding_version=llama_cpp.__version__, state_params=state_params(self._llama))
        return prefix_key(self._prefix_key_base, prefix)

    def next_token_logits(self, messages: list[dict], cache_prefix: str | None = None) -> np.ndarray:
        """The logits of the first token a chat call would generate for ``messages`` (a copy), with
        ``cache_prefix`` taken from the unit cache as a call would (exactness checks and benchmarks)."""

        def run() -> np.ndarray:
            self._use_prefix(messages, cache_prefix)
            llama = self._llama
            full = self.chat_prompt_tokens(messages)
            n = common_prefix(list(llama._input_ids[: llama.n_tokens]), full[:-1])
            if n == 0:
                llama.reset()
            llama.n_tokens = n
            llama.eval(full[n:])
            return np.ctypeslib.as_array(llama._ctx.get_logits(), shape=(llama.n_vocab(),)).copy()

        return self._run(run, "logits")[0]

    def forget_prefixes(self) -> None:
        """The context's tokens and the RAM prompt cache emptied: the next prompt is evaluated whole."""
        with self._lock:
            self._forget_locked()

    def _forget_locked(self) -> None:
        llama = self._llama
        if llama is None:
            return
        llama.reset()
        cache = getattr(llama, "cache", None)
        if cache is not None and hasattr(cache, "cache_state"):
            cache.cache_state.clear()

    def close(self) -> None:
        """Free the model and its context now (idempotent; later calls raise :class:`LLMError`)."""
        with self._lock:
            llama, self._llama = self._llama, None
        _OPEN.discard(self)
        if llama is not None:
            close = getattr(llama, "close", None)
            if close:
                close()

    async def aclose(self) -> None:
        self.close()


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


@dataclass
class _Done:
    """End of a streamed generation: ``(tokens in context, prompt tokens evaluated)`` or the error."""

    value: Any
