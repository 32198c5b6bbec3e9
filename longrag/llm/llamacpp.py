"""In-process llama.cpp backend (llama-cpp-python): the CPU default with a bundled GGUF model.

``model`` is a bundled model name (see :mod:`longrag.llm.bundled`: the default reader
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
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import logging
import math
import os
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, AsyncIterator

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
from longrag.llm.bundled import BUNDLED_MODELS, DEFAULT_READER_MODEL, BundledModel, file_sha256, resolve_model_path
from longrag.llm.cancel import AbortSwitch, CancelToken, LLMCancelled
from longrag.llm.kvcache import PrefixState, PrefixStateCache
from longrag.text.tokens import trim_to_tokens

__all__ = ["BUNDLED_MODELS", "BundledModel", "LlamaCppLLM", "resolve_model_path"]

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
        _one_row_of_logits(llama)
        if prompt_cache_mb > 0:
            # Saved KV states keyed by token prefix: a conversation's next turn finds its own prefix
            # again even when another request ran in between (llama.cpp keeps only the last one).
            llama.set_cache(_make_ram_cache(prompt_cache_mb << 20))
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
        self._formatter = _chat_formatter(llama)
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

    def _evaluated_prompt_tokens(self) -> int:
        return self._evaluated_tokens()[0]

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
        n = min(_common_prefix(full, head), len(full) - 1)  # llama.cpp evaluates the last token again
        if n < self.min_cached_prefix_tokens:
            return ""
        prefix = np.asarray(full[:n], dtype=np.int32)
        llama = self._llama
        if llama.n_tokens >= n and np.array_equal(np.asarray(llama._input_ids[:n], dtype=np.int32), prefix):
            return "context"
        if self.unit_cache is None:
            llama.reset()
            llama.eval(prefix.tolist())
            return ""
        key = self._prefix_key(prefix)
        entry, source = self.unit_cache.get(key)
        if entry is not None and np.array_equal(entry.tokens, prefix):
            if self._load_prefix(entry):
                return source
            # llama.cpp refused the state: out of both tiers (kept, it would fail every request for
            # its unit), and the prefix evaluated and stored afresh as on a miss
            self.unit_cache.discard(key)
        llama.reset()
        llama.eval(prefix.tolist())
        saved = llama.save_state()
        self.unit_cache.put(key, PrefixState(tokens=prefix, state=saved.llama_state,
                                             scores=np.array(saved.scores[-1:], dtype=np.float32), seed=saved.seed))
        return "miss"

    def _load_prefix(self, entry: PrefixState) -> bool:
        """Put ``entry``'s state in the context; False when llama.cpp refuses it (damaged bytes, a
        state of another layout). llama-cpp-python sets the context's tokens before
        ``llama_state_set_data``, and a failed load may have changed part of the KV memory, so then
        the context is reset and its memory cleared: it must not claim a prefix it does not hold
        (the next call would take it from the context). Any exception means the same here."""
        import llama_cpp

        llama = self._llama
        input_ids = np.zeros(llama._n_ctx, dtype=np.intc)
        input_ids[: len(entry.tokens)] = entry.tokens
        try:
            llama.load_state(llama_cpp.LlamaState(
                input_ids=input_ids, scores=entry.scores.copy(), n_tokens=len(entry.tokens),
                llama_state=entry.state, llama_state_size=len(entry.state), seed=entry.seed))
            return True
        except Exception as exc:
            log.warning("%s: llama.cpp could not load a cached state of %d tokens (%s): evaluating it again",
                        self.name, len(entry.tokens), exc)
            llama.reset()
            clear = getattr(getattr(llama, "_ctx", None), "kv_cache_clear", None)  # not in every binding
            if clear is not None:
                clear()
            return False

    def _prefix_key(self, prefix: np.ndarray) -> str:
        """sha256 of :func:`prefix_key_base` (the model, adapter, chat format, binding and context
        layout: fixed for the life of the context, so computed once) and of the prefix's token ids
        (which spell the prompt template and the unit's content)."""
        if self._prefix_key_base is None:
            import llama_cpp

            model_sha = self._model_sha256 or file_sha256(self.model_path)
            lora = f"{file_sha256(self._lora[0])}:{self._lora[1]}" if self._lora else "-"
            self._prefix_key_base = prefix_key_base(
                model_sha256=model_sha, lora=lora, chat_format=self._llama.chat_format,
                binding_version=llama_cpp.__version__, state_params=state_params(self._llama))
        h = hashlib.sha256(self._prefix_key_base.encode())
        h.update(prefix.astype("<i4").tobytes())
        return h.hexdigest()

    def next_token_logits(self, messages: list[dict], cache_prefix: str | None = None) -> np.ndarray:
        """The logits of the first token a chat call would generate for ``messages`` (a copy), with
        ``cache_prefix`` taken from the unit cache as a call would (exactness checks and benchmarks)."""

        def run() -> np.ndarray:
            self._use_prefix(messages, cache_prefix)
            llama = self._llama
            full = self.chat_prompt_tokens(messages)
            n = _common_prefix(list(llama._input_ids[: llama.n_tokens]), full[:-1])
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


KV_FORMAT_VERSION = "2"
"""Part of every unit-cache key: bump when what a stored state holds changes (2: keys name the
binding's version and the context's layout, see :func:`prefix_key_base`)."""

#: the context parameters a ``llama_state_get_data`` blob depends on: its KV cells' number, types and
#: arrangement (``n_seq_max``, ``swa_full``, ``kv_unified``), and their values' last bits (the batch
#: sizes and flash attention change how the sums run). Names a binding lacks are left out
#: (``flash_attn`` was a bool before ``flash_attn_type``).
STATE_PARAMS = ("n_batch", "n_ubatch", "n_seq_max", "type_k", "type_v", "flash_attn", "flash_attn_type",
                "swa_full", "kv_unified")


def state_params(llama: Any) -> dict[str, Any]:
    """The context's :data:`STATE_PARAMS` that this binding has (``llama.context_params``) and its
    real window (``llama.n_ctx()``: llama.cpp may round the asked one up)."""
    params = llama.context_params
    out = {name: getattr(params, name) for name in STATE_PARAMS if hasattr(params, name)}
    out["n_ctx"] = int(llama.n_ctx())
    return out


def prefix_key_base(*, model_sha256: str, lora: str, chat_format: str | None, binding_version: str,
                    state_params: dict[str, Any]) -> str:
    """The part of a unit-cache key beside the prefix's tokens: everything that changes the bytes of
    a stored state or whether the backend can load it. The disk tier outlives the process and is
    shared by the node's replicas, so a state made by another model, adapter, llama-cpp-python
    (``llama_state_get_data``'s format follows llama.cpp's) or context layout must land under
    another key rather than be loaded -- or fail to load -- in its place."""
    params = ",".join(f"{name}={state_params[name]!r}" for name in sorted(state_params))
    return f"{KV_FORMAT_VERSION}|{model_sha256}|{lora}|{chat_format}|llama-cpp-python {binding_version}|{params}"


class LlamaVocab:
    """Text counted and cut in a llama.cpp model's tokens (no BOS, no special tokens), through a
    ``Llama`` of the model (a vocabulary-only one from :meth:`load`) under the lock its calls take.
    The token ids of the last :attr:`MEMO` texts of at least :attr:`MEMO_MIN_CHARS` are kept: a
    reader counts a unit, then may cut it, and hot units come back with the next questions."""

    MEMO = 64
    MEMO_MIN_CHARS = 2048

    def __init__(self, llama: Any, lock: threading.Lock | None = None) -> None:
        self.llama, self.lock = llama, lock or threading.Lock()
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()

    @classmethod
    def load(cls, model: str) -> "LlamaVocab":
        """The GGUF's vocabulary only (no weights): a reader's fitter beside a remote LLM."""
        from llama_cpp import Llama

        return cls(Llama(model_path=str(resolve_model_path(model)), vocab_only=True, verbose=False))

    def tokenize(self, text: str) -> np.ndarray:
        with self.lock:
            ids = self._memo.get(text)
            if ids is not None:
                self._memo.move_to_end(text)
                return ids
            ids = np.asarray(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=False), dtype=np.int32)
            if len(text) >= self.MEMO_MIN_CHARS:
                self._memo[text] = ids
                if len(self._memo) > self.MEMO:
                    self._memo.popitem(last=False)
            return ids

    def __call__(self, text: str) -> int:
        return len(self.tokenize(text)) if text else 0

    def truncate(self, text: str, n: int) -> str:
        """:func:`~longrag.text.tokens.trim_to_tokens`' cut (the longest word prefix within ``n``
        tokens), checked first at the word end before the offset where the text's ``n``-th token
        ends: two counts of prefixes, where the search over a 4K-token unit's words takes a dozen."""
        if n <= 0:
            return ""
        ids = self.tokenize(text)
        if len(ids) <= n:
            return text
        with self.lock:
            head = self.llama.detokenize(ids[:n].tolist())
        near = len(text.encode("utf-8")[: len(head)].decode("utf-8", errors="ignore"))
        return trim_to_tokens(text, n, self, near=near)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _chat_formatter(llama: Any) -> Any:
    """The formatter behind ``llama.create_chat_completion``: a named chat format's (``chatml``) or
    the GGUF's own template (llama-cpp-python's ``chat_template.default``); None when neither."""
    from llama_cpp import llama_chat_format as lcf

    name = llama.chat_format
    if name == "chat_template.default":
        template = (llama.metadata or {}).get("tokenizer.chat_template")
        if not template:
            return None
        eos, bos = llama.token_eos(), llama.token_bos()
        return lcf.Jinja2ChatFormatter(
            template=template, eos_token=llama._model.token_get_text(eos) if eos != -1 else "",
            bos_token=llama._model.token_get_text(bos) if bos != -1 else "", stop_token_ids=[eos])
    return getattr(lcf, "format_" + str(name).replace("-", "_"), None) if name else None


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def resolve_threads(n_threads: int | None, cpus: float | None = None) -> int:
    """llama.cpp threads for a call of ``n_threads`` (``llm.n_threads``): a number is kept; None takes
    ``cpus`` (the CPUs a Ray replica holds) rounded up, or every usable CPU when ``cpus`` is None, and
    never more than the process may run on.

    llama-cpp-python's own default is ``cpu_count() // 2`` (one thread on a 2-core machine): it
    assumes hyper-threads, where a second thread per core buys little. Generation is bound by memory
    bandwidth and prompt evaluation by arithmetic; both scale with the cores a replica really holds."""
    if n_threads is not None:
        if n_threads <= 0:
            raise ValueError(f"n_threads must be positive or None, got {n_threads}")
        return int(n_threads)
    if cpus is not None and cpus <= 0:
        raise ValueError(f"cpus must be positive or None, got {cpus}")
    limit = usable_cpus()
    return limit if cpus is None else max(1, min(limit, math.ceil(cpus - 1e-9)))


def _retrieved(future: "asyncio.Future[Any]") -> None:
    if not future.cancelled():
        future.exception()


@dataclass
class _Done:
    """End of a streamed generation: ``(tokens in context, prompt tokens evaluated)`` or the error."""

    value: Any


def _one_row_of_logits(llama: Any) -> None:
    """Shrink llama-cpp-python's logits buffer (``Llama.scores``, n_batch x vocabulary floats: 311 MB
    for Qwen2.5's 152K-token vocabulary) to one row.

    Without ``logits_all`` nothing writes it (sampling runs in llama.cpp; only logprobs, which need
    ``logits_all``, read it), but ``load_state`` broadcasts a saved state's row over its first
    n_tokens rows on every prompt-cache hit: the whole buffer became resident at the first hit (the
    demo's LLMServer grew by ~0.6 GB over seven questions). With one row, slices of it stay one row."""
    import numpy as np

    if not getattr(llama, "_logits_all", False):
        llama.scores = np.zeros((1, llama.n_vocab()), dtype=np.single)


def _make_ram_cache(capacity_bytes: int) -> Any:
    """llama-cpp-python's RAM prompt cache, bounded for real (see :class:`_BoundedRAMCache`)."""
    import llama_cpp

    class _BoundedRAMCache(llama_cpp.LlamaRAMCache):
        """``LlamaRAMCache`` counts only a saved state's KV bytes against its capacity, not the copy of
        the logits saved with it (up to n_batch x vocabulary floats: 311 MB per state for Qwen2.5's
        152K-token vocabulary), so a 256 MB cache held over 4 GB (the demo's LLMServer at 5.7 GB RSS).
        Here a state keeps its last row of logits only (on a hit llama.cpp evaluates the last prompt
        token again, which rewrites it) and is counted whole."""

        def __setitem__(self, key: Any, value: Any) -> None:
            value.scores = value.scores[-1:].copy()
            super().__setitem__(key, value)

        @property
        def cache_size(self) -> int:
            return sum(s.llama_state_size + s.scores.nbytes + s.input_ids.nbytes for s in self.cache_state.values())

    return _BoundedRAMCache(capacity_bytes=capacity_bytes)
