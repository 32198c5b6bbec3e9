"""``ray.serve.llm``'s vLLM apps, able to serve the bundled reader.

``import_path: serve.llm_app:build_private_app`` (what the configs deploy) takes one model's
:class:`ray.serve.llm.LLMConfig` fields as ``args`` and builds its ``LLMServer`` deployment alone
(``ray.serve.llm.build_llm_deployment``): deployed with ``route_prefix: null`` it has no HTTP route,
and the LongRAG app reaches it through a deployment handle (``llm.backend=serve``,
:mod:`serve.llm_handle`), so the public proxy serves only the guarded app.
``import_path: serve.llm_app:build_app`` takes the same ``args`` as ``ray.serve.llm:build_openai_app``
(``llm_configs``: a list of LLMConfig fields): the OpenAI-compatible router, for a proxy only trusted
clients reach. Both add one thing: a
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

from ray.serve.llm import LLMConfig, build_llm_deployment, build_openai_app

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


def build_private_app(args: dict[str, Any]) -> Any:
    """Serve application builder: one model's ``LLMServer`` deployment, no router (see module doc)."""
    if not isinstance(args, dict) or not isinstance(args.get("model_loading_config"), dict):
        raise ValueError(f"serve.llm_app:build_private_app needs one model's LLMConfig fields as args "
                         f"(model_loading_config, engine_kwargs, ...), got {args!r}")
    return build_llm_deployment(resolve_llm_config(args))
