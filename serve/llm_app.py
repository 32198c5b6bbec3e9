"""``ray.serve.llm``'s OpenAI-compatible vLLM app, able to serve the bundled reader.

``import_path: serve.llm_app:build_app`` takes the same ``args`` as ``ray.serve.llm:build_openai_app``
(``llm_configs``: a list of :class:`ray.serve.llm.LLMConfig` fields), with one addition: a
``model_loading_config.model_source`` of ``bundled:<name>`` (e.g. ``bundled:qwen2.5-coder-0.5b-instruct``)
is the bundled GGUF model exported to a HuggingFace folder (:func:`longrag.llm.hf_export.export_hf_model`,
cached), so vLLM serves exactly the model llama.cpp runs by default. Any other source (a hub name, a
folder, ``s3://...``) passes through unchanged.

The export runs where Serve builds the application (the head node) and the folder is a local path:
on a single machine that is where the replica runs. On a multi-node cluster give the model as a
folder every node has, a hub name or an ``s3://`` mirror instead.
"""

from __future__ import annotations

import copy
from typing import Any

from ray.serve.llm import LLMConfig, build_openai_app

from longrag.llm.hf_export import export_hf_model

BUNDLED_PREFIX = "bundled:"


def resolve_llm_config(raw: dict[str, Any]) -> LLMConfig:
    """One ``llm_configs`` entry -> a validated LLMConfig, a ``bundled:`` source exported first."""
    raw = copy.deepcopy(raw)
    loading = raw.get("model_loading_config")
    source = loading.get("model_source") if isinstance(loading, dict) else None
    if isinstance(source, str) and source.startswith(BUNDLED_PREFIX):
        loading["model_source"] = str(export_hf_model(source[len(BUNDLED_PREFIX):]))
    return LLMConfig(**raw)


def build_app(args: dict[str, Any]) -> Any:
    """Serve application builder (see module doc)."""
    if not isinstance(args, dict) or not isinstance(args.get("llm_configs"), list) or not args["llm_configs"]:
        raise ValueError(f"serve.llm_app needs args {{'llm_configs': [<LLMConfig fields>, ...]}}, got {args!r}")
    rest = {k: v for k, v in args.items() if k != "llm_configs"}
    return build_openai_app({**rest, "llm_configs": [resolve_llm_config(c) for c in args["llm_configs"]]})
