"""Build the configured LLM backend."""

from __future__ import annotations

from longrag.config import LLMConfig
from longrag.llm.base import LLM


def unit_cache(config: LLMConfig):
    """The llama.cpp backend's unit KV cache from ``llm.unit_cache_*`` (None when off)."""
    if config.unit_cache_mb <= 0:
        return None
    from longrag.llm.kvcache import PrefixStateCache
    from longrag.models.bundled import model_cache_dir

    disk_dir = config.unit_cache_dir or str(model_cache_dir().parent / "kv")
    return PrefixStateCache(config.unit_cache_mb << 20, config.unit_cache_disk_mb << 20,
                            disk_dir if config.unit_cache_disk_mb else None)


def build_llm(config: LLMConfig) -> LLM:
    """``config.backend`` -> a ready :class:`LLM` (llama.cpp loads its model here)."""
    if config.backend == "llamacpp":
        from longrag.llm.llamacpp import LlamaCppLLM

        return LlamaCppLLM(
            config.model,
            n_ctx=config.context_window,
            n_threads=config.n_threads,
            seed=config.seed,
            temperature=config.temperature,
            chat_format=config.chat_format,
            flash_attn=config.flash_attn,
            prompt_cache_mb=config.prompt_cache_mb,
            lora_path=config.lora_path,
            lora_scale=config.lora_scale,
            unit_cache=unit_cache(config),
        )
    if config.backend == "openai":
        if not config.base_url:
            raise ValueError("llm.backend=openai needs llm.base_url (e.g. http://127.0.0.1:8000/v1)")
        if config.lora_path:
            raise ValueError(
                "llm.lora_path applies to the llamacpp backend only; with llm.backend=openai serve the adapter on the "
                "server (vLLM: --enable-lora --lora-modules NAME=ADAPTER_DIR) and set llm.model=NAME"
            )
        from longrag.llm.openai_http import OpenAIHTTPLLM

        return OpenAIHTTPLLM(
            config.base_url,
            config.model,
            api_key_env=config.api_key_env,
            context_window=config.context_window,
            temperature=config.temperature,
            seed=config.seed,
            timeout_s=config.timeout_s,
            max_retries=config.max_retries,
            tokenizer_file=config.tokenizer_file,
        )
    if config.backend == "serve":
        raise ValueError("llm.backend=serve reaches a ray.serve.llm application through a Serve handle: it is built "
                         "inside a Ray process (serve.llm_handle.build_engine), not by the Ray-free core")
    raise ValueError(f"unknown llm.backend {config.backend!r}; expected 'llamacpp', 'openai' or 'serve'")
