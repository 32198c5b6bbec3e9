"""What ``python -m jobs.bench serve`` asks and checks (Ray-free): the questions it cycles through,
the checks of one served response, and the summary against the issue's goals."""

from __future__ import annotations

from typing import Any

import httpx

from lab.bench.load import LevelResult, grows_with_concurrency
from longrag.config import LongRAGConfig
from longrag.index.artifacts import ArtifactStore, require_unit_graph
from longrag.index.fusion import Fusion
from longrag.index.graph import GraphExpansion, expand, split_mode
from longrag.types import Retrieval

GOAL_OVERHEAD_P50_MS = 10.0  # /v1/retrieve overhead p50 at most 10 ms over in-process encode + search
GOAL_THROUGHPUT_RATIO = 0.9  # /v1/retrieve req/s over HTTP at the highest level, at least 0.9x in process

# Questions the enwiki sample answers; requests cycle through them (chat levels take their own).
QUESTIONS = [
    "Who wrote the novel Animal Farm?",
    "Which spaceflight first landed humans on the Moon?",
    "What is the capital of Angola?",
    "Who composed An American in Paris?",
    "Which country is Aruba a constituent country of?",
    "Who wrote Atlas Shrugged?",
    "Which Apollo mission first orbited the Moon?",
    "What is the atomic number of an element?",
    "Who founded the Academy Awards?",
    "Where is Andorra located?",
    "Which tennis player won the career Golden Slam in 1999?",
    "Who was the vice president who wrote about climate change?",
    "What does an aardvark eat?",
    "Which philosopher wrote The World as Will and Representation?",
    "What is the SI unit of electric current?",
    "Who directed the film Solaris in 1972?",
    "What is anarcho-capitalism?",
    "Which ocean lies between Africa and the Americas?",
    "Who was Alexander the Great's teacher?",
    "What is the largest city of Alaska?",
]


def retrieve_check(k: int, traces: list[dict[str, float]] | None = None):
    """A check of one ``/v1/retrieve`` response (and, with ``traces``, its trace and client latency)."""

    def check(result: tuple[httpx.Response, float]) -> str | None:
        r, ms = result
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text[:200]}"
        body = r.json()
        if len(body["units"]) != k or body["coverage"]["degraded"]:
            return f"{len(body['units'])} units (asked {k}), coverage {body['coverage']}"
        if traces is not None:
            t = body["trace"]
            row = {key: float(t[key]) for key in ("encode_ms", "retrieve_ms", "retrieve.search_ms",
                                                    "retrieve.fetch_ms", "total_ms") if key in t}
            row["client_ms"] = ms
            row["outside_ingress_ms"] = ms - float(t["total_ms"])
            traces.append(row)
        return None

    return check


def chat_check(result: httpx.Response) -> str | None:
    if result.status_code != 200:
        return f"HTTP {result.status_code}: {result.text[:200]}"
    body = result.json()
    if not body["choices"][0]["message"]["content"].strip():
        return "empty answer"
    return None


def brief(r: LevelResult) -> str:
    return (f"{r.throughput_rps} req/s, p50 {r.latency.p50_ms} ms, p99 {r.latency.p99_ms} ms"
            + (f", {r.errors} errors ({r.error_examples[0]})" if r.errors else ""))


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The figures the issue asks for: overhead at concurrency 1 against the goal, and scaling."""
    rows = result["retrieve"]
    first = min(rows, key=lambda r: r["concurrency"])
    last = max(rows, key=lambda r: r["concurrency"])
    out = {
        "retrieve_overhead_p50_ms": {str(r["concurrency"]): r["overhead"]["p50_ms"] for r in rows},
        "retrieve_overhead_p50_ms_goal": GOAL_OVERHEAD_P50_MS,
        "retrieve_overhead_goal_met": first["overhead"]["p50_ms"] <= GOAL_OVERHEAD_P50_MS,
        "retrieve_throughput_ratio": {str(r["concurrency"]): r["overhead"]["throughput_ratio"] for r in rows},
        "retrieve_throughput_ratio_goal": GOAL_THROUGHPUT_RATIO,
        "retrieve_throughput_goal_met": last["overhead"]["throughput_ratio"] >= GOAL_THROUGHPUT_RATIO,
        "serve_floor_p50_ms": {str(r["concurrency"]): r["serve_floor"]["latency"]["p50_ms"] for r in rows
                               if "serve_floor" in r},
        "retrieve_throughput_rps": {str(r["concurrency"]): r["http"]["throughput_rps"] for r in rows},
        "retrieve_throughput_grows": grows_with_concurrency({r["concurrency"]: r["http"]["throughput_rps"] for r in rows}),
        "errors": sum(r["http"]["errors"] + r["in_process"]["errors"] for r in rows + result.get("chat", [])),
    }
    if result.get("chat"):
        out["chat_throughput_rps"] = {str(r["concurrency"]): r["http"]["throughput_rps"] for r in result["chat"]}
        out["chat_overhead_p50_ms"] = {str(r["concurrency"]): r["overhead"]["p50_ms"] for r in result["chat"]}
    if result.get("stream"):
        out["stream_first_token_overhead_p50_ms"] = result["stream"]["first_token_overhead_p50_ms"]
        out["errors"] += result["stream"]["errors"]
    return out


async def http_first_token(client: httpx.AsyncClient, question: str, k: int) -> dict[str, Any]:
    """One streamed ``/v1/chat/completions`` (model ``longrag``): ms to the first event with text
    (the long answer's first delta, ``reasoning_content``, or the answer), ms to ``[DONE]``, the
    answer, and the error event's text if the stream ended in one."""
    import json
    import time

    t0 = time.perf_counter()
    first_ms, answer, error = None, "", None
    body = {"model": "longrag", "k": k, "stream": True, "messages": [{"role": "user", "content": question}]}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = str(event["error"])[:200]
                continue
            delta = event["choices"][0]["delta"]
            text = delta.get("reasoning_content") or delta.get("content") or ""
            if text and first_ms is None:
                first_ms = (time.perf_counter() - t0) * 1e3
            answer += delta.get("content") or ""
    return {"first_token_ms": first_ms, "total_ms": (time.perf_counter() - t0) * 1e3, "answer": answer, "error": error}


async def reader_first_token(reader: Any, question: str, units: list[Any]) -> dict[str, Any]:
    """The same in process: ``LongReader.read_stream`` over already retrieved units."""
    import time

    t0 = time.perf_counter()
    first_ms, answer = None, ""
    async for item in reader.read_stream(question, units):
        if isinstance(item, str):
            if item and first_ms is None:
                first_ms = (time.perf_counter() - t0) * 1e3
        else:
            answer = item.answer
            if first_ms is None:  # no long answer to stream: the answer is the first text
                first_ms = (time.perf_counter() - t0) * 1e3
    return {"first_token_ms": first_ms, "total_ms": (time.perf_counter() - t0) * 1e3, "answer": answer, "error": None}


def first_token_summary(http: list[dict[str, Any]], local: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of time to first token and to the end, over HTTP and in process, and their difference."""
    import statistics

    def med(rows: list[dict[str, Any]], key: str) -> float | None:
        xs = [r[key] for r in rows if r.get(key) is not None]
        return round(statistics.median(xs), 1) if xs else None

    out = {"requests": len(http), "errors": sum(1 for r in http if r.get("error") or not r.get("answer")),
           "http_first_token_p50_ms": med(http, "first_token_ms"), "in_process_first_token_p50_ms": med(local, "first_token_ms"),
           "http_total_p50_ms": med(http, "total_ms"), "in_process_total_p50_ms": med(local, "total_ms")}
    a, b = out["http_first_token_p50_ms"], out["in_process_first_token_p50_ms"]
    out["first_token_overhead_p50_ms"] = round(a - b, 1) if a is not None and b is not None else None
    return out


class InProcessRetrieval:
    """Encode + sharded search + unit fetch in this process: the work of ``/v1/retrieve`` without
    Serve, HTTP or actors (the app's own in-process index, ``InProcessIndex``, called directly)."""

    def __init__(self, index: str, cfg: LongRAGConfig) -> None:
        import torch

        from actors.inprocess_index import InProcessIndex
        from longrag.index.embedding import Embedder

        torch.set_num_threads(1)  # as the QueryEncoder (torch_threads=1)
        self.embedder = Embedder(cfg.embedding)
        self.index = InProcessIndex(index, cfg.index)
        self.fusion = Fusion.of(cfg.retrieval)
        self.expansion = GraphExpansion.of(cfg.retrieval)
        self.uri, self.graph = index, None  # the graph is read by the first graph-mode call

    def __call__(self, question: str, k: int, mode: str = "dense") -> Retrieval:
        hybrid, graph = split_mode(mode)
        query = self.embedder.encode_queries([question])
        found = self.index.search_sync(query, self.expansion.first_stage_k(k) if graph else k,
                                       [question] if hybrid else None, self.fusion)
        if not graph:
            return Retrieval(units=self.index.retrieve_units_sync(found.hits[0]), coverage=found.coverage)
        self.graph = self.graph or require_unit_graph(ArtifactStore.open(self.uri))
        hits = expand(found.hits[0], self.graph, k, self.expansion)
        return Retrieval(units=self.index.retrieve_units_sync(hits, query[0], False), coverage=found.coverage)
