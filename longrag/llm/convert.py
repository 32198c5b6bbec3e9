"""A PEFT LoRA adapter -> llama.cpp's LoRA GGUF, so a fine-tuned adapter runs on the bundled GGUF model
(``llm.lora_path``). The base model's HuggingFace folder, which fine-tuning trains on, comes from
:func:`longrag.llm.hf_export.export_hf_model`.
"""

from __future__ import annotations

import json
from pathlib import Path

from longrag.models.bundled import resolve_model_path

__all__ = ["lora_to_gguf"]


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
