"""GGUF -> Hugging Face folder, and a PEFT LoRA adapter -> llama.cpp's LoRA GGUF
(:mod:`longrag.llm.convert`). The real conversions load the bundled SmolLM2 and are ``slow``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from longrag.config import LLMConfig
from longrag.llm.base import LLMError
from longrag.llm.convert import lora_to_gguf
from longrag.llm.factory import build_llm
from longrag.llm.hf_export import STAMP, export_hf_model

BASE = "smollm2-135m-instruct"


def test_lora_to_gguf_refuses_what_llamacpp_cannot_apply(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "use_dora": True, "lora_alpha": 8}))
    with pytest.raises(ValueError, match="dora=True"):
        lora_to_gguf(tmp_path, BASE)


def test_lora_path_must_be_a_gguf_and_is_llamacpp_only(tmp_path):
    with pytest.raises(LLMError, match="not a LoRA adapter .gguf"):
        build_llm(LLMConfig(model=BASE, lora_path=str(tmp_path / "missing.gguf"), context_window=512))
    with pytest.raises(ValueError, match="enable-lora"):
        build_llm(LLMConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="m", lora_path="a.gguf"))


@pytest.mark.slow
def test_gguf_to_hf_folder_answers_and_is_cached(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = export_hf_model(BASE, tmp_path / "hf")
    stamp = json.loads((folder / STAMP).read_text())
    assert stamp["gguf"].endswith(".gguf") and stamp["model"] == BASE
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert export_hf_model(BASE, tmp_path / "hf") == folder and (folder / "model.safetensors").stat().st_mtime_ns == mtime
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)  # fmt: skip
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=10, do_sample=False)
    assert "Paris" in tok.decode(out[0][ids["input_ids"].shape[1]:])


@pytest.mark.slow
def test_lora_gguf_moves_llamacpp_logits_as_peft_moves_hf_logits(tmp_path):
    """A random LoRA on the q/k projections (the ones llama.cpp stores permuted): the change it makes to
    llama.cpp's logits must match the change PEFT makes to the HF model's logits."""
    import torch
    from llama_cpp import Llama
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from longrag.models.bundled import resolve_model_path

    folder = export_hf_model(BASE)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    text = "<|im_start|>user\nWhat is the capital of France? Tell me about its history.<|im_end|>\n<|im_start|>assistant\nThe"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        base_hf = model(torch.tensor([ids])).logits[0].numpy()
    torch.manual_seed(0)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj"]))
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.1)
    with torch.no_grad():
        tuned_hf = peft(torch.tensor([ids])).logits[0].numpy()
    peft.save_pretrained(tmp_path / "adapter")
    gguf = lora_to_gguf(tmp_path / "adapter", BASE)

    def cpp(lora):
        llm = Llama(model_path=str(resolve_model_path(BASE)), lora_path=lora, n_ctx=256, logits_all=True, verbose=False)
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)])

    base_cpp, tuned_cpp = cpp(None), cpp(str(gguf))
    d_hf, d_cpp = (tuned_hf - base_hf).ravel(), (tuned_cpp - base_cpp).ravel()
    noise = np.linalg.norm(base_hf - base_cpp)
    assert np.linalg.norm(d_hf) > 2 * noise  # the adapter's effect stands out of the Q4-vs-float difference
    assert np.corrcoef(d_hf, d_cpp)[0, 1] > 0.7
