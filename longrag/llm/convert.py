"""Convert a GGUF model (a bundled one or any ``.gguf`` file) to a regular Hugging Face model folder.

Fine-tuning (``jobs.finetune``), vLLM and any transformers code need a model folder, while the
bundled models ship as GGUF. transformers reads GGUF itself (``from_pretrained(..., gguf_file=...)``,
with the ``gguf`` package): the tensors are de-quantized to float and the tokenizer rebuilt from the
GGUF's vocabulary. The result is saved as safetensors with its tokenizer (a GGUF without a chat
template gets the template its bundled entry names, ChatML for the Qwen reader).

Folders are cached under ``$LONGRAG_MODEL_CACHE/hf/NAME`` with a stamp
(``longrag_conversion.json``: the GGUF's sha256, size and mtime, the transformers version); a folder
whose stamp matches its GGUF is reused, anything else is converted again. Conversion happens under a
file lock into a temporary folder that is renamed into place, so concurrent callers and a crash
never leave a half-written folder behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from longrag.llm.base import LLMError
from longrag.llm.bundled import BUNDLED_MODELS, file_sha256, model_cache_dir, resolve_model_path

__all__ = ["STAMP", "CHATML_TEMPLATE", "gguf_to_hf", "hf_folder_name", "lora_to_gguf"]

log = logging.getLogger(__name__)

STAMP = "longrag_conversion.json"

# ChatML as the Qwen2.5 instruct models write it (also what llama.cpp's "chatml" format produces).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_TEMPLATES = {"chatml": CHATML_TEMPLATE}


def hf_folder_name(model: str) -> str:
    """The cache folder name of ``model`` (a bundled name, or a .gguf path's stem)."""
    return model if model in BUNDLED_MODELS else Path(model).stem


def _source_stamp(gguf: Path) -> dict:
    import transformers

    st = gguf.stat()
    return {"gguf": str(gguf), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "transformers": transformers.__version__}


def _stamp_ok(dest: Path, source: dict) -> bool:
    try:
        stamp = json.loads((dest / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return {k: stamp.get(k) for k in source} == source and (dest / "config.json").is_file()


def gguf_to_hf(model: str, out_dir: str | Path | None = None, *, dtype: str = "float32") -> Path:
    """``model`` (a bundled model name or a .gguf path) -> a Hugging Face model folder (cached).

    ``dtype`` is the saved weights' dtype (float32 trains on CPU; bfloat16 halves the folder).
    Raises :class:`LLMError` naming the model when transformers cannot read its GGUF."""
    import torch
    from filelock import FileLock

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype {dtype!r} is not one of float32, bfloat16, float16")
    gguf = resolve_model_path(model)
    dest = Path(out_dir) if out_dir else model_cache_dir() / "hf" / hf_folder_name(model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    source = {**_source_stamp(gguf), "dtype": dtype}
    with FileLock(str(dest) + ".lock"):
        if _stamp_ok(dest, source):
            return dest
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("converting %s (%s) to a Hugging Face folder at %s", model, gguf, dest)
        try:
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                          dtype=getattr(torch, dtype))  # fmt: skip
        except (ValueError, KeyError, OSError, RuntimeError) as e:
            raise LLMError(f"transformers could not read the GGUF of {model!r} ({gguf}): {e}") from e
        spec = BUNDLED_MODELS.get(model)
        if not tok.chat_template and spec is not None and spec.chat_format in _TEMPLATES:
            tok.chat_template = _TEMPLATES[spec.chat_format]
        # A model loaded from GGUF carries a quantizer that refuses to save; its weights are already
        # plain tensors: move them into a fresh model of the same config.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
        missing = [k for k in missing if k not in getattr(plain, "_tied_weights_keys", {}) and "lm_head" not in k]
        if missing or unexpected:
            raise LLMError(f"converting {model!r}: weights missing {missing[:5]} / unexpected {unexpected[:5]}")
        if spec is not None and loaded.generation_config is not None:
            plain.generation_config = loaded.generation_config
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            plain.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            (tmp / STAMP).write_text(json.dumps({**source, "gguf_sha256": spec.sha256 if spec and spec.sha256
                                                 else file_sha256(gguf)}, indent=2))  # fmt: skip
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest


# ------------------------------------------------------------------------------ LoRA -> GGUF

#: Architectures whose llama.cpp conversion permutes the rows of q/k projections (rotary layout),
#: so a LoRA's B matrices must be permuted the same way; the others are written as they are.
_PERMUTE_QK = {"llama": True, "qwen2": False, "qwen3": False}


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    if hasattr(f, "contents"):
        return f.contents()
    part = f.parts[f.data[0]]
    return bytes(part).decode("utf-8") if part.dtype.kind == "u" and part.dtype.itemsize == 1 else part[0]


def _permute_rows(w, n_head: int, n_head_kv: int | None):
    """llama.cpp's q/k row permutation (convert_hf_to_gguf's LlamaModel.permute) on the output rows."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def lora_to_gguf(adapter_dir: str | Path, base: str, out_path: str | Path | None = None) -> Path:
    """A PEFT LoRA adapter folder trained on the HF conversion of ``base`` (a bundled model name or
    a .gguf path) -> a llama.cpp LoRA adapter GGUF (``general.type=adapter``, ``adapter.type=lora``,
    ``blk.N.<tensor>.weight.lora_a/lora_b``), loadable with ``Llama(lora_path=...)`` on top of the
    base GGUF, quantized or not. Raises ValueError for adapters llama.cpp cannot apply (rsLoRA, DoRA,
    modules outside the transformer blocks, an unsupported architecture)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    adapter = Path(adapter_dir)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    if cfg.get("peft_type") != "LORA" or cfg.get("use_rslora") or cfg.get("use_dora"):
        raise ValueError(f"{adapter}: only plain LoRA adapters convert (peft_type={cfg.get('peft_type')}, "
                         f"rslora={cfg.get('use_rslora')}, dora={cfg.get('use_dora')})")  # fmt: skip
    base_gguf = resolve_model_path(base)
    reader = gguf.GGUFReader(str(base_gguf))
    arch = str(_field(reader, "general.architecture"))
    if arch not in _PERMUTE_QK:
        raise ValueError(f"LoRA -> GGUF: architecture {arch!r} of {base!r} is not supported; supported: {sorted(_PERMUTE_QK)}")
    n_blocks = int(_field(reader, f"{arch}.block_count"))
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    n_kv = _field(reader, f"{arch}.attention.head_count_kv")
    n_kv = int(n_kv) if n_kv is not None else None
    base_names = {t.name for t in reader.tensors}
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, n_blocks)

    weights = load_file(str(adapter / "adapter_model.safetensors"))
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, w in weights.items():
        stem, sep, rest = key.partition(".lora_")
        if not sep or rest not in ("A.weight", "B.weight"):
            raise ValueError(f"{adapter}: tensor {key!r} is not a LoRA A/B weight (trained modules_to_save cannot convert)")
        pairs.setdefault(stem.removeprefix("base_model.model."), {})[rest[0]] = w.astype(np.float32)
    out = Path(out_path) if out_path else adapter / "adapter.gguf"
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(cfg["lora_alpha"]))
    for hf_name in sorted(pairs):
        ab = pairs[hf_name]
        name = names.get_name(hf_name + ".weight", try_suffixes=(".weight",))
        if name is None or name not in base_names or set(ab) != {"A", "B"}:
            raise ValueError(f"{adapter}: LoRA module {hf_name!r} has no tensor in {base_gguf.name} (mapped to {name!r})")
        a, b = ab["A"], ab["B"]
        if _PERMUTE_QK[arch] and hf_name.endswith("q_proj"):
            b = _permute_rows(b, n_head, n_head)
        elif _PERMUTE_QK[arch] and hf_name.endswith("k_proj"):
            b = _permute_rows(b, n_head, n_kv)
        writer.add_tensor(name + ".lora_a", np.ascontiguousarray(a))
        writer.add_tensor(name + ".lora_b", np.ascontiguousarray(b))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
