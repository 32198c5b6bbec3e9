"""``make demo``: index the bundled Wikipedia sample, serve it, ask questions over HTTP.

Starts a local Ray, builds a grouped-unit index of the 106-article enwiki sample (lead sections
grouped along their hyperlinks), deploys the Serve app with the bundled CPU models (MiniLM
embeddings, Qwen2.5-Coder-0.5B-Instruct through llama.cpp), asks a handful of questions over HTTP, prints answers with
the titles of their evidence and the figures of the run, shuts everything down, and exits
non-zero on any failure.

The terminal shows only the demo's own transcript. Everything else the process writes — Ray's and
Serve's logs, the output Ray forwards from workers and replicas (one INFO line per replica call),
Ray Data's progress, library warnings, C-level messages — goes to ``--log`` (default
``artifacts/demo.log``), named at the start and at the end; Ray's own per-process log files stay in
its session folder, also named at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import httpx
import psutil
import pyarrow as pa

from lab.bench import latency_stats
from longrag.cli import add_config_flags, job_setup, transcript
from longrag.data import SAMPLE_WIKI, data_path
from longrag.memory import MemorySampler

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = data_path(SAMPLE_WIKI)
# Questions about the sample, with the answers a reader should give (any alias counts).
QUESTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("Who wrote the novel Animal Farm?", ("George Orwell", "Orwell", "Eric Arthur Blair")),
    ("Which spaceflight first landed humans on the Moon?", ("Apollo 11",)),
    ("What is the capital of Angola?", ("Luanda",)),
    ("Who composed An American in Paris?", ("George Gershwin", "Gershwin")),
    ("Which country is Aruba a constituent country of?", ("the Netherlands", "Kingdom of the Netherlands")),
    # multi-hop: each answer needs two articles (the comparison's two sides)
    ("Who was born first, Aldous Huxley or Ayn Rand?", ("Aldous Huxley", "Huxley")),
    ("Which mission flew first, Apollo 8 or Apollo 11?", ("Apollo 8",)),
]


def is_correct(answer: str, golds: tuple[str, ...]) -> bool:
    """A gold answer (or alias) occurs in the answer, ignoring case, punctuation and articles."""
    from longrag.eval.metrics import normalize_answer

    got = f" {normalize_answer(answer)} "
    return any(f" {normalize_answer(g)} " in got for g in golds)

log = logging.getLogger("jobs.demo")


def ask_streamed(client: httpx.Client, question: str, k: int) -> tuple[int, Any, float, float]:
    """``/v1/answer`` streamed, as a chat UI asks: (status, the final AnswerResponse or the error
    text, ms to the short answer's event, ms to the end of the stream)."""
    t0 = time.perf_counter()
    first_ms, body, event = 0.0, None, None
    with client.stream("POST", "/v1/answer", json={"question": question, "k": k, "stream": True}) as r:
        if r.status_code != 200:
            return r.status_code, r.read().decode(errors="replace"), 0.0, 0.0
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                if event == "answer":
                    first_ms = (time.perf_counter() - t0) * 1e3
                elif event == "trace":
                    body = json.loads(line[6:])
                elif event == "error":
                    return 500, line[6:], 0.0, 0.0
    return 200, body, first_ms, (time.perf_counter() - t0) * 1e3


def raw_short_answers(build: str, config: Any, asked: list[tuple[str, list[str]]]) -> list[float]:
    """``--raw-baseline``: ms of plain llama-cpp-python (``Llama.create_chat_completion``, context
    reset, the threads the LLMServer had) on each short answer's own prompt: the units the app
    retrieved, fitted by the reader's rules, in the direct prompt. Runs after Ray is shut down."""
    from llama_cpp import Llama

    from longrag.index.artifacts import ArtifactStore, load_shard_units
    from longrag.llm import build_llm
    from longrag.llm.llamacpp import resolve_model_path, resolve_threads
    from longrag.reading.prompts import direct_messages, format_context
    from longrag.reading.reader import LongReader

    store = ArtifactStore.open(build)
    units = {u.unit_id: u for s in store.read_manifest().shards for u in load_shard_units(store, s.shard_id)}
    fitter = build_llm(config.llm.model_copy(update={"unit_cache_mb": 0, "prompt_cache_mb": 0}))
    reader = LongReader(fitter, config.reader)
    prompts = [direct_messages(q, format_context(reader.fit(q, [units[i] for i in ids]).blocks)) for q, ids in asked]
    chat_format = fitter.chat_format
    fitter.close()
    threads = resolve_threads(config.llm.n_threads, config.llm.num_cpus)
    llm = Llama(model_path=str(resolve_model_path(config.llm.model)), n_ctx=config.llm.context_window,
                n_threads=threads, n_threads_batch=threads, flash_attn=config.llm.flash_attn, chat_format=chat_format,
                verbose=False)
    out = []
    for messages in prompts:
        llm.reset()
        t0 = time.perf_counter()
        llm.create_chat_completion(messages=messages, max_tokens=config.reader.short_answer_max_tokens,
                                   temperature=0.0, stop=["\nQuestion:"], seed=config.llm.seed)
        out.append((time.perf_counter() - t0) * 1e3)
    llm.close()
    return out


def p50(values: list[float]) -> float:
    return latency_stats(values, digits=1).p50_ms


def run(args: argparse.Namespace) -> int:
    """The demo; its transcript goes to the terminal, all other output to ``args.log``."""
    log_path = Path(args.log).resolve()
    print(f"== LongRAG demo. Ray's and Serve's logs go to {log_path}", flush=True)
    with transcript(log_path) as terminal:
        summary, ray_logs = _run(args, terminal)
    print("\n== summary\n" + json.dumps(summary, indent=2))
    print(f"== logs: {log_path}" + (f" (Ray's per-process log files: {ray_logs})" if ray_logs else ""))
    return 1 if summary["failures"] else 0


def _run(args: argparse.Namespace, terminal: TextIO) -> tuple[dict[str, Any], str | None]:
    def say(*parts: Any) -> None:
        print(*parts, file=terminal, flush=True)

    from ray import serve

    from actors.distbuild import build_corpus_index
    from cluster.local import start_or_join
    from longrag.config import load_config
    from serve.app import AppArgs, app_builder
    from serve.run import wait_healthy

    t_start = time.perf_counter()
    config = load_config(args.config, [
        "units.kind=grouped", "units.text_mode=lead", f"index.shards={args.shards}",
        f"index.replicas={args.replicas}", "serve.colocate=true",
        # the LLM gets every CPU but the Ingress' share: llama.cpp runs a thread per CPU it holds
        f"llm.num_cpus={max(1.0, args.num_cpus - 0.25):g}", *args.set,
    ])
    out = str(Path(args.out).resolve())
    failures: list[str] = []
    retrieve_ms: list[float] = []
    answer_ms: list[float] = []
    short_ms: list[float] = []
    asked: list[tuple[str, list[str]]] = []  # (question, retrieved unit ids best first)
    correct: list[bool] = []
    report: dict[str, Any] = {}
    index_peak = 0
    index_processes: dict[str, float] = {}
    index_at_peak: dict[str, float] = {}
    from longrag.index.encoders import resolve_backend
    from longrag.index.openvino_ir import ensure_ir

    if resolve_backend(config.embedding, "cpu") == "openvino-ir":  # exported once, before the measured run
        say(f"== the encoder without torch: OpenVINO IR in {ensure_ir(config.embedding)}")
    with MemorySampler(0.5, children=True) as mem:
        handle = start_or_join(None, num_cpus=args.num_cpus)
        ray_logs = handle.logs_dir
        try:
            say(f"== 1/3 indexing {SAMPLE.name} -> {out}")
            report = build_corpus_index(str(SAMPLE), "wikixml", out, config, overwrite=True,
                                        command=["python", "-m", "jobs.demo"])
            counts = report["counts"]
            hist = {int(n): c for n, c in report["grouping"]["docs_per_unit"].items()}
            multi = sum(c for n, c in hist.items() if n > 1)
            say(f"   {counts['documents']} documents -> {counts['units']} grouped units "
                f"({multi} hold several documents, up to {max(hist)}) -> {counts['chunks']} chunks "
                f"in {counts['shards']} shards; build {report['timings_s']['total_s']}s "
                f"({report['read']['n_bad']} pages skipped: {[b['title'] for b in report['read']['bad']]})")

            # Serve on a fresh Ray, as a cluster serves what an index job built: the build's idle
            # workers (Ray keeps up to --num-cpus of them, each with its imports) go with the old one.
            handle.shutdown()
            gc.collect()  # this process' freed build buffers (Python's garbage, Arrow's pool) back to the OS
            pa.default_memory_pool().release_unused()
            handle = start_or_join(None, num_cpus=args.num_cpus, quiet=args.quiet_ray)
            index_processes, index_at_peak = mem.peaks_mb(), mem.at_peak_mb()
            index_peak = mem.new_phase()  # the serving phase's own peak from here
            say("== 2/3 deploying the Serve app (cpu.yaml's single-machine layout: the LLM, and an Ingress "
                "holding encoder, index and readers)" if config.serve.colocate else
                "== 2/3 deploying the Serve app (query encoder, retriever over shard actors, reader, LLM)")
            serve.start(http_options={"host": "127.0.0.1", "port": args.port})
            serve.run(app_builder(AppArgs(index=out)), name="longrag", route_prefix="/", blocking=False)
            base = f"http://127.0.0.1:{args.port}"
            with httpx.Client(base_url=base, timeout=300) as client:
                health = wait_healthy(client)
                say(f"   healthy: {json.dumps(health)}")

                say("== 3/3 asking questions over HTTP")
                for q, golds in QUESTIONS[: args.questions]:
                    t0 = time.perf_counter()
                    r = client.post("/v1/retrieve", json={"question": q, "k": args.k})
                    retrieve_ms.append((time.perf_counter() - t0) * 1e3)
                    if r.status_code != 200:
                        failures.append(f"retrieve {q!r}: HTTP {r.status_code} {r.text[:300]}")
                        continue
                    status, body, first_ms, whole_ms = ask_streamed(client, q, args.k)
                    if status != 200 or body is None:
                        failures.append(f"answer {q!r}: HTTP {status} {str(body)[:300]}")
                        continue
                    short_ms.append(first_ms)
                    answer_ms.append(whole_ms)
                    asked.append((q, [ev["unit_id"] for ev in body["evidence"]]))
                    if not body["answer"].strip():
                        failures.append(f"answer {q!r}: empty answer")
                    if body["coverage"]["degraded"]:
                        failures.append(f"answer {q!r}: degraded coverage {body['coverage']}")
                    right = is_correct(body["answer"], golds)
                    correct.append(right)
                    say(f"\nQ: {q}\nA: {body['answer']}   [{'right' if right else 'wrong'}: {golds[0]}]"
                        f"\n   long answer: {body['long_answer'][:300]}")
                    for ev in body["evidence"]:
                        mark = "*" if ev["used"] else " "
                        say(f"   {mark} {ev['score']:.3f}  {ev['unit_id']}: {' | '.join(ev['titles'][:6])}"
                            f"{' ...' if len(ev['titles']) > 6 else ''}")
                    t = body["trace"]
                    say(f"   trace: encode {t['encode_ms']} ms, retrieve {t['retrieve_ms']} ms, short answer after "
                        f"{first_ms / 1e3:.1f} s, long answer done after {whole_ms / 1e3:.1f} s, "
                        f"tokens {t['prompt_tokens']}+{t['completion_tokens']} "
                        f"({t['long_answer_cached_tokens']} of the long answer's from the KV cache)"
                        + (f", short answer replaced ({t['answer_fallback']})" if t.get("answer_fallback") else ""))
                bad = client.post("/v1/answer", json={"question": "", "k": 3})
                if bad.status_code != 422:
                    failures.append(f"an empty question should get 422, got {bad.status_code}")
        except Exception as exc:  # report and fail: the demo must exit non-zero on any failure
            log.exception("demo failed")  # the traceback goes to the log file
            failures.append(f"{type(exc).__name__}: {exc} (traceback in {args.log})")
        finally:
            ray_processes = psutil.Process().children(recursive=True)  # raylet's workers outlive it briefly
            try:
                serve.shutdown()
            except Exception:
                pass
            handle.shutdown()
    left: list[int] = []
    if args.raw_baseline:  # the baseline times a quiet machine: Ray's processes gone first
        left = [p.pid for p in psutil.wait_procs(ray_processes, timeout=30)[1]]

    summary = {
        "wall_s": round(time.perf_counter() - t_start, 1),
        "build": report.get("timings_s") if report else None,
        "counts": report.get("counts") if report else None,
        "retrieve_p50_ms": p50(retrieve_ms),
        "short_answer_p50_ms": p50(short_ms),  # time to the short answer (its SSE event)
        "answer_p50_ms": p50(answer_ms),  # the whole answer, the long answer included
        "answers_right": f"{sum(correct)}/{len(correct)}",
        "peak_rss_gib": round(max(index_peak, mem.peak_bytes) / 2**30, 2),
        "peak_rss_gib_by_phase": {"index": round(index_peak / 2**30, 2), "serve": round(mem.peak_bytes / 2**30, 2)},
        # MB by process, the largest first: each one's own peak, and what each held when the phase peaked
        "peak_rss_mb_by_process": {"index": index_processes, "serve": mem.peaks_mb()},
        "peak_rss_mb_at_peak": {"index": index_at_peak, "serve": mem.at_peak_mb()},
        "failures": failures,
    }
    if args.raw_baseline and asked:
        raw = raw_short_answers(out, config, asked)
        summary["raw_short_answer_p50_ms"] = p50(raw)
        summary["short_answer_to_raw_p50"] = round(p50(short_ms) / p50(raw), 3)
        if left:
            failures.append(f"Ray's processes {left} were still running 30 s after shutdown: the raw baseline "
                            "is not a quiet machine's")
    if args.max_rss_gib is not None and summary["peak_rss_gib"] > args.max_rss_gib:
        failures.append(f"peak RSS {summary['peak_rss_gib']} GiB is over --max-rss-gib {args.max_rss_gib}")
    return summary, ray_logs


def main(argv: list[str] | None = None) -> int:
    job_setup(logging.WARNING)
    p = argparse.ArgumentParser(prog="python -m jobs.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "artifacts" / "demo"), help="index build folder")
    p.add_argument("--log", default=str(ROOT / "artifacts" / "demo.log"),
                   help="file for Ray's, Serve's and the libraries' output (the terminal shows the transcript)")
    for flag, default in (("--shards", 2), ("--replicas", 2), ("--k", 2), ("--questions", len(QUESTIONS)), ("--port", 8000)):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--num-cpus", type=float, default=2, help="logical CPUs of the local Ray (default: 2, this machine's cores)")
    p.add_argument("--raw-baseline", action="store_true", help="also time plain llama-cpp-python on each short "
                   "answer's own prompt (after the run) and print the ratio of the short answer's p50 to it")
    p.add_argument("--quiet-ray", action="store_true", help="serve on a Ray whose bookkeeping runs at "
                   "single-machine rates (cluster.local.QUIET_RAY_ENV: half its idle CPU, no measured gain in answer time)")
    p.add_argument("--max-rss-gib", type=float, help="fail when the peak RSS (this process, Ray and its "
                   "workers, sampled every 0.5 s) is above this many GiB")
    add_config_flags(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
