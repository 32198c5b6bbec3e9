"""LoRA supervised fine-tuning on LRGinstruction with Ray Train (``TorchTrainer`` + TRL/PEFT).

    python -m jobs.finetune --data artifacts/lrginstruction --out artifacts/lora-smollm2 --max-steps 30
    python -m jobs.finetune --data s3dir --base /models/Qwen2.5-7B-Instruct --num-workers 4 --gpu \\
        --storage s3://bucket/ray-train --max-steps 600

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Section 3.2: the pipeline's small models are tuned on
LRGinstruction. ``--data`` is the folder ``jobs.lrg_instruct`` wrote (``train.jsonl``,
``heldout.jsonl``); the driver reads the records and hands them to the workers, so the workers
need no shared file system. Each worker runs :func:`longrag.training.sft.train_lora` (data-parallel under
``torch.distributed`` when ``--num-workers`` > 1); a bundled ``--base`` (default the smallest,
SmolLM2-135M) is converted from GGUF to a model folder on the worker's node, once
(:mod:`longrag.llm.convert`). The first worker reports the adapter as the run's checkpoint; the
driver copies it to ``OUT/adapter`` (``adapter_config.json``, ``adapter_model.safetensors``, the
tokenizer, ``training_log.json`` with the loss of every step) and draws the loss curve (``--plot``).
For a GGUF base (bundled) it also writes ``OUT/adapter.gguf``, the adapter in llama.cpp's format:
``--set llm.model=BASE --set llm.lora_path=OUT/adapter.gguf`` serves the tuned model in process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from longrag.cli import add_cluster_flags, choice_list, number
from longrag.llm.convert import lora_to_gguf
from longrag.lrg.records import KINDS
from longrag.models.bundled import BUNDLED_MODELS
from longrag.training.sft import SFTSettings, mean_loss, plot_loss, read_messages

log = logging.getLogger("jobs.finetune")


def train_loop(config: dict) -> None:
    """One Ray Train worker: train, then report the adapter (first worker) as the checkpoint."""
    import ray.train

    from longrag.training.sft import SFTSettings, train_lora

    ctx = ray.train.get_context()
    with tempfile.TemporaryDirectory() as tmp:
        result = train_lora(SFTSettings(**config["settings"]), config["train"], tmp, heldout=config["heldout"])
        metrics = {"first_loss": result["first_loss"], "last_loss": result["last_loss"],
                   "eval_loss": result["eval_loss"], "examples": result["examples"]}  # fmt: skip
        checkpoint = None
        if ctx.get_world_rank() == 0:
            checkpoint = ray.train.Checkpoint.from_directory(str(Path(tmp) / "adapter"))
        ray.train.report(metrics, checkpoint=checkpoint)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    d = SFTSettings()
    p = argparse.ArgumentParser(prog="python -m jobs.finetune", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="folder with train.jsonl (and heldout.jsonl) from jobs.lrg_instruct")
    p.add_argument("--out", required=True, help="folder for the adapter and the run's report")
    p.add_argument("--base", default=d.base_model, help="a bundled model name or a Hugging Face model folder")
    p.add_argument("--kinds", type=choice_list(KINDS), default=list(KINDS), help=f"comma list of {', '.join(KINDS)}")
    p.add_argument("--max-steps", type=number(int, min_value=1), default=d.max_steps)
    p.add_argument("--learning-rate", type=number(float, min_value=0, min_exclusive=True), default=d.learning_rate)
    p.add_argument("--batch-size", type=number(int, min_value=1), default=d.batch_size, help="per worker")
    p.add_argument("--grad-accum", type=number(int, min_value=1), default=d.grad_accum)
    p.add_argument("--max-length", type=number(int, min_value=32), default=d.max_length)
    p.add_argument("--lora-r", type=number(int, min_value=1), default=d.lora_r)
    p.add_argument("--lora-alpha", type=number(int, min_value=1), default=d.lora_alpha)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--num-workers", type=number(int, min_value=1), default=1, help="Ray Train workers")
    p.add_argument("--gpu", action="store_true", help="one GPU per worker (CUDA)")
    p.add_argument("--cpus-per-worker", type=number(float, min_value=0, min_exclusive=True), default=1.0)
    p.add_argument("--torch-threads", type=number(int, min_value=1), default=None)
    p.add_argument("--max-failures", type=number(int, min_value=0), default=2,
                   help="restart the worker group this many times after a worker dies (e.g. killed for memory)")
    p.add_argument("--storage", default=None, help="Ray Train storage (a shared folder or s3://...; default OUT/ray)")
    p.add_argument("--plot", default=None, help="write the loss curve PNG here (default OUT/loss.png)")
    add_cluster_flags(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data, out = Path(args.data), Path(args.out).resolve()
    try:
        if not (data / "train.jsonl").is_file():
            raise ValueError(f"{data}: no train.jsonl (write it with python -m jobs.lrg_instruct)")
        settings = SFTSettings(base_model=args.base, kinds=tuple(args.kinds), max_steps=args.max_steps,
                               learning_rate=args.learning_rate, batch_size=args.batch_size, grad_accum=args.grad_accum,
                               max_length=args.max_length, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
                               seed=args.seed, device="cuda" if args.gpu else "cpu",
                               torch_threads=args.torch_threads or max(1, int(args.cpus_per_worker)))  # fmt: skip
        train = read_messages(data / "train.jsonl", settings.kinds)
        heldout = read_messages(data / "heldout.jsonl", settings.kinds) if (data / "heldout.jsonl").is_file() else []
        if not train:
            raise ValueError(f"{data / 'train.jsonl'} has no record of kinds {', '.join(settings.kinds)}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchTrainer

    from cluster.local import start_or_join

    handle = start_or_join(args.address, num_cpus=args.num_cpus, num_gpus=None if args.gpu else 0)
    try:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"settings": settings.model_dump(), "train": train, "heldout": heldout},
            scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.gpu,
                                         resources_per_worker={"CPU": args.cpus_per_worker}),  # fmt: skip
            run_config=RunConfig(name="lrg-lora", storage_path=args.storage or str(out / "ray"),
                                 failure_config=FailureConfig(max_failures=args.max_failures)),
        )
        try:
            result = trainer.fit()
        except TrainingFailedError as e:  # e.g. a worker killed for memory more than --max-failures times
            print(f"error: training failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
            return 1
        if result.checkpoint is None:
            print("error: the training run reported no checkpoint", file=sys.stderr)
            return 1
        adapter = out / "adapter"
        if adapter.exists():
            shutil.rmtree(adapter)
        result.checkpoint.to_directory(str(adapter))
    finally:
        if handle.started:
            handle.shutdown()
    gguf_adapter = None
    if args.base in BUNDLED_MODELS or args.base.endswith(".gguf"):  # llama.cpp can serve it on the GGUF base
        gguf_adapter = lora_to_gguf(adapter, args.base, out / "adapter.gguf")
    log_ = json.loads((adapter / "training_log.json").read_text())
    hist = log_["history"]
    plot = plot_loss(hist, args.plot or out / "loss.png",
                     f"LoRA SFT of {args.base} on LRGinstruction ({log_['examples']} records, {log_['device']})")
    summary = {
        "adapter": str(adapter),
        "base": args.base,
        "examples": log_["examples"],
        "too_long": log_["too_long"],
        "steps": len(hist),
        "loss_first3": round(mean_loss(hist, True), 4),
        "loss_last3": round(mean_loss(hist, False), 4),
        "eval_loss": log_["eval_loss"],
        "train_s": log_["train_s"],
        "plot": str(plot),
        "adapter_gguf": str(gguf_adapter) if gguf_adapter else None,
    }
    (out / "finetune_report.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sys.exit(main())
