"""llama-cpp-python's memory beside the model and its KV cache, bounded: the logits it keeps.

Both bounds are the same fact seen twice: nothing here reads more than the last row of logits
(sampling runs in llama.cpp; only logprobs, which need ``logits_all``, read the rest), yet the
binding allocates n_batch x vocabulary floats per context and copies them with every saved state
(311 MB each for Qwen2.5's 152K-token vocabulary). Kept apart from the engine
(:mod:`longrag.llm.llamacpp`) because they are workarounds of the binding's, each with its own
measurement, not part of how a call runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["make_ram_cache", "one_row_of_logits"]


def one_row_of_logits(llama: Any) -> None:
    """Shrink llama-cpp-python's logits buffer (``Llama.scores``, n_batch x vocabulary floats: 311 MB
    for Qwen2.5's 152K-token vocabulary) to one row.

    Without ``logits_all`` nothing writes it (sampling runs in llama.cpp; only logprobs, which need
    ``logits_all``, read it), but ``load_state`` broadcasts a saved state's row over its first
    n_tokens rows on every prompt-cache hit: the whole buffer became resident at the first hit (the
    demo's LLMServer grew by ~0.6 GB over seven questions). With one row, slices of it stay one row."""
    if not getattr(llama, "_logits_all", False):
        llama.scores = np.zeros((1, llama.n_vocab()), dtype=np.single)


def make_ram_cache(capacity_bytes: int) -> Any:
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
