"""The unit KV cache's side of a llama.cpp context: which tokens a prefix is, the key its state is
stored under, and that state put in and taken out of the context.

The cache itself (two tiers, budgets, files) is :mod:`longrag.llm.kvcache` and knows nothing of
llama.cpp; the engine (:mod:`longrag.llm.llamacpp`) decides when a call uses a prefix. What is here
is the contract between them: a key that names everything that shapes a stored state's bytes, and a
context that never claims a prefix it does not hold.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from longrag.llm.kvcache import PrefixState, PrefixStateCache

__all__ = ["KV_FORMAT_VERSION", "STATE_PARAMS", "chat_formatter", "common_prefix", "hold_prefix", "load_state",
           "prefix_key", "prefix_key_base", "state_params"]

log = logging.getLogger(__name__)

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


def prefix_key(base: str, prefix: np.ndarray) -> str:
    """sha256 of :func:`prefix_key_base`'s ``base`` and of the prefix's token ids (which spell the
    prompt template and the unit's content)."""
    h = hashlib.sha256(base.encode())
    h.update(prefix.astype("<i4").tobytes())
    return h.hexdigest()


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def chat_formatter(llama: Any) -> Any:
    """The formatter behind ``llama.create_chat_completion``: a named chat format's (``chatml``) or
    the GGUF's own template (llama-cpp-python's ``chat_template.default``); None when neither. A
    prefix's tokens are cut from the prompt it renders, so without one the unit cache is off."""
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


def hold_prefix(llama: Any, prefix: np.ndarray, cache: PrefixStateCache | None, key_of: Callable[[np.ndarray], str],
                name: str) -> str:
    """Make ``llama``'s context hold exactly the tokens ``prefix`` (under the engine's lock); returns
    where their state came from: "context" (it held them already), "ram" or "disk" (the unit cache),
    "miss" (evaluated here and stored under ``key_of(prefix)``), "" (evaluated, no cache).

    A stored state is loaded only when its token ids equal ``prefix``; one llama.cpp refuses is
    taken out of both tiers (kept, it would fail every request for its unit) and the prefix
    evaluated and stored afresh as on a miss. The prefix is evaluated alone in every case, so the
    rest of the prompt is evaluated after it in the same batches whether the cache is on, off, hit
    or missed (see :meth:`longrag.llm.llamacpp.LlamaCppLLM._use_prefix`)."""
    n = len(prefix)
    if llama.n_tokens >= n and np.array_equal(np.asarray(llama._input_ids[:n], dtype=np.int32), prefix):
        return "context"
    if cache is None:
        llama.reset()
        llama.eval(prefix.tolist())
        return ""
    key = key_of(prefix)
    entry, source = cache.get(key)
    if entry is not None and np.array_equal(entry.tokens, prefix):
        if load_state(llama, entry, name):
            return source
        cache.discard(key)
    llama.reset()
    llama.eval(prefix.tolist())
    saved = llama.save_state()
    cache.put(key, PrefixState(tokens=prefix, state=saved.llama_state,
                               scores=np.array(saved.scores[-1:], dtype=np.float32), seed=saved.seed))
    return "miss"


def load_state(llama: Any, entry: PrefixState, name: str) -> bool:
    """Put ``entry``'s state in ``llama``'s context; False when llama.cpp refuses it (damaged bytes, a
    state of another layout). llama-cpp-python sets the context's tokens before
    ``llama_state_set_data``, and a failed load may have changed part of the KV memory, so then
    the context is reset and its memory cleared: it must not claim a prefix it does not hold
    (the next call would take it from the context). Any exception means the same here."""
    import llama_cpp

    input_ids = np.zeros(llama._n_ctx, dtype=np.intc)
    input_ids[: len(entry.tokens)] = entry.tokens
    try:
        llama.load_state(llama_cpp.LlamaState(
            input_ids=input_ids, scores=entry.scores.copy(), n_tokens=len(entry.tokens),
            llama_state=entry.state, llama_state_size=len(entry.state), seed=entry.seed))
        return True
    except Exception as exc:
        log.warning("%s: llama.cpp could not load a cached state of %d tokens (%s): evaluating it again",
                    name, len(entry.tokens), exc)
        llama.reset()
        clear = getattr(getattr(llama, "_ctx", None), "kv_cache_clear", None)  # not in every binding
        if clear is not None:
            clear()
        return False
