"""The one LLM interface and its backends.

``LLM`` (async ``chat``/``complete`` returning :class:`ChatResult` with token counts) is all the
rest of the product sees; :func:`build_llm` picks the backend from :class:`~longrag.config.LLMConfig`:
``llamacpp`` (in process, bundled GGUF models, the CPU default) or ``openai`` (any
OpenAI-compatible HTTP server: vLLM, ``ray.serve.llm``, hosted APIs). Backends import lazily so
``import longrag.llm`` stays cheap.
"""

from longrag.llm.base import LLM, ChatResult, ContextOverflowError, LLMError
from longrag.llm.factory import build_llm

__all__ = ["LLM", "ChatResult", "ContextOverflowError", "LLMError", "build_llm"]
