"""LoRA supervised fine-tuning on LRGinstruction with TRL and PEFT (one worker's training loop).

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Section 3.2: the small models of the pipeline are tuned on
LRGinstruction. Each record's chat ``messages`` become a conversational prompt-completion pair
(system + user -> the assistant's gold output), so the loss is on the gold output only. Records
longer than ``max_length`` tokens are left out and counted (truncating them would cut off the very
output the model should learn). ``jobs.finetune`` runs :func:`train_lora` inside Ray Train workers;
it also runs as is in one process.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from longrag.lrg.records import KINDS, InstructionRecord, Kind

log = logging.getLogger(__name__)

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class SFTSettings(BaseModel):
    """What :func:`train_lora` trains and how."""

    model_config = ConfigDict(extra="forbid")

    base_model: str = Field(
        "smollm2-135m-instruct",
        description="A bundled model name (converted from GGUF, see longrag.llm.convert) or a Hugging Face model folder.",
    )
    kinds: tuple[Kind, ...] = KINDS
    max_steps: int = Field(20, gt=0)
    learning_rate: float = Field(2e-4, gt=0)
    batch_size: int = Field(1, gt=0, description="Per worker.")
    grad_accum: int = Field(1, gt=0)
    max_length: int = Field(1024, gt=16, description="Tokens per example; longer records are left out.")
    lora_r: int = Field(16, gt=0)
    lora_alpha: int = Field(32, gt=0)
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: str | list[str] = Field("all-linear", description="PEFT target modules.")
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool | None = Field(None, description="None: on CUDA when supported.")
    torch_threads: int | None = None


def to_prompt_completion(messages: list[dict]) -> dict:
    """Chat ``messages`` ending in the assistant's reply -> TRL's conversational prompt-completion form."""
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("a training record must end with the assistant's message")
    return {"prompt": messages[:-1], "completion": messages[-1:]}


def read_messages(path: str | Path, kinds: tuple[str, ...]) -> list[list[dict]]:
    """The chat messages of the records of ``kinds`` in one LRGinstruction JSONL file."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rec = InstructionRecord.model_validate_json(line)
                if rec.kind in kinds:
                    out.append([m.model_dump() for m in rec.messages])
    return out


def fit_examples(conversations: list[list[dict]], tokenizer, max_length: int) -> tuple[list[dict], int]:
    """Prompt-completion rows of the conversations that fit ``max_length`` tokens, and how many did not."""
    rows, too_long = [], 0
    for msgs in conversations:
        if len(tokenizer.apply_chat_template(msgs, tokenize=True)) > max_length:
            too_long += 1
        else:
            rows.append(to_prompt_completion(msgs))
    return rows, too_long


def resolve_base(base: str) -> str:
    """A bundled model name or .gguf file -> its converted Hugging Face folder (cached); a folder stays as is."""
    from longrag.models.bundled import BUNDLED_MODELS

    if base in BUNDLED_MODELS or base.endswith(".gguf"):
        from longrag.llm.hf_export import export_hf_model

        return str(export_hf_model(base))
    if not Path(base).is_dir():
        raise ValueError(f"base model {base!r} is neither a bundled model ({', '.join(sorted(BUNDLED_MODELS))}), "
                         "a .gguf file nor a Hugging Face model folder")
    return base


def train_lora(
    settings: SFTSettings,
    train: list[list[dict]],
    out_dir: str | Path,
    heldout: list[list[dict]] | None = None,
    on_log: Callable[[dict], None] | None = None,
) -> dict:
    """Train a LoRA adapter on the ``train`` conversations; on the world's first process save it
    (with its config and the tokenizer) to ``out_dir/adapter`` with ``training_log.json`` (the loss
    at every step, the held-out loss). Returns that log."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    cuda = torch.cuda.is_available() and settings.device != "cpu"
    if settings.device == "cuda" and not cuda:
        raise ValueError("device=cuda but no CUDA GPU is visible")
    bf16 = settings.bf16 if settings.bf16 is not None else bool(cuda and torch.cuda.is_bf16_supported())
    out = Path(out_dir)
    base = resolve_base(settings.base_model)
    tok = AutoTokenizer.from_pretrained(base)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    rows, too_long = fit_examples(train, tok, settings.max_length)
    if not rows:
        raise ValueError(f"none of the {len(train)} training records fits max_length={settings.max_length} tokens")
    eval_rows = fit_examples(heldout, tok, settings.max_length)[0] if heldout else None
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16 if bf16 else torch.float32)
    history: list[dict] = []

    class Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs and state.is_world_process_zero:
                entry = {"step": state.global_step, "loss": float(logs["loss"]), "time_s": round(time.perf_counter() - t0, 2)}
                history.append(entry)
                if on_log:
                    on_log(entry)
            elif logs and "eval_loss" in logs and on_log:
                on_log({"step": state.global_step, "eval_loss": float(logs["eval_loss"])})

    cfg = SFTConfig(
        output_dir=str(out / "trainer"),
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.grad_accum,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        max_length=settings.max_length,
        seed=settings.seed,
        use_cpu=not cuda,
        bf16=bf16,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    lora = LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha, lora_dropout=settings.lora_dropout,
                      target_modules=settings.target_modules, task_type="CAUSAL_LM")  # fmt: skip
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows),
                         eval_dataset=Dataset.from_list(eval_rows) if eval_rows else None,
                         processing_class=tok, peft_config=lora, callbacks=[Log()])  # fmt: skip
    t0 = time.perf_counter()
    trainer.train()
    eval_loss = None
    if eval_rows:
        eval_loss = float(trainer.evaluate()["eval_loss"])
    result = {
        "base_model": settings.base_model,
        "base_folder": base,
        "settings": settings.model_dump(),
        "examples": len(rows),
        "too_long": too_long,
        "eval_examples": len(eval_rows or []),
        "eval_loss": eval_loss,
        "history": history,
        "first_loss": history[0]["loss"] if history else None,
        "last_loss": history[-1]["loss"] if history else None,
        "train_s": round(time.perf_counter() - t0, 1),
        "device": "cuda" if cuda else "cpu",
    }
    if trainer.is_world_process_zero():
        adapter = out / "adapter"
        trainer.model.save_pretrained(adapter)
        tok.save_pretrained(adapter)
        (adapter / "training_log.json").write_text(json.dumps(result, indent=2))
    return result


def mean_loss(history: list[dict], first: bool, n: int = 3) -> float:
    """Mean loss of the first (or last) ``n`` logged steps."""
    xs = [h["loss"] for h in history if "loss" in h]
    part = xs[:n] if first else xs[-n:]
    return sum(part) / len(part) if part else math.nan


def plot_loss(history: list[dict], path: str | Path, title: str) -> Path:
    """A PNG of the training loss per step."""
    from longrag.figures import pyplot, save_figure

    plt = pyplot()
    steps = [h["step"] for h in history if "loss" in h]
    loss = [h["loss"] for h in history if "loss" in h]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    ax.plot(steps, loss, marker="o", markersize=3)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (gold output tokens)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=110)
