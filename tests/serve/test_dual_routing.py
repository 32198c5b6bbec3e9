"""Dual strategies on the Serve layer without a cluster: the request schemas, the ``DualReader`` calling
the three stage deployments (the real deployment classes, joined by in-process handles, their LLM a
scripted ``LLMServer``), each stage's own model, and the Ingress routing ``strategy`` requests of
``/v1/answer`` and ``/v1/longcontext`` to them. The HTTP app with real models: tests/serve/test_app.py."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from longrag.config import DualConfig, EmbeddingConfig, LLMConfig, LongRAGConfig
from longrag.dual.service import DualService
from longrag.llm.base import ChatResult
from longrag.types import Coverage, Retrieval, RetrievedUnit, Unit
from serve.dual import DualExtractor, DualFilter, DualGenerator, DualReader, units_to_paragraphs
from serve.gateway import InProcess
from serve.longcontext import LongContextRequest
from serve.schemas import AnswerRequest
from tests.longrag.test_dual_pipeline import _stage_reply
from tests.longrag.test_dual_retrieval import _BagEncoder

DOC = ("Marie Curie was born in Warsaw. She moved to Paris.\n\nWarsaw is the capital of Poland.\n\n"
       "Bananas are rich in potassium.")  # fmt: skip
Q = "In which country was Marie Curie born?"
OPENAI = LLMConfig(backend="openai", model="m", base_url="http://127.0.0.1:8399/v1")


Handle = InProcess  # a deployment handle in process: handle.method.remote(...) awaits the object's method


class FakeLLMServer:
    """The LLMServer's methods over scripted stage replies; records the calls per method."""

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.calls: list[str] = []
        self.reply = _stage_reply()

    def _result(self, text: str) -> ChatResult:
        return ChatResult(text, prompt_tokens=10, completion_tokens=2, latency_ms=1.0, model=self.name)

    async def chat(self, messages, max_tokens, temperature=None, stop=None, cache_prefix=None):
        self.calls.append("chat")
        return self._result(self.reply(messages))

    async def chat_json(self, messages, schema, max_tokens, temperature=None):
        self.calls.append("chat_json")
        return self._result(self.reply(messages))


def _reader(dual: DualConfig, servers: dict[str, FakeLLMServer]) -> DualReader:
    stages = {
        name: cls.func_or_class(Handle(servers[name]), OPENAI, dual)
        for name, cls in (("extractor", DualExtractor), ("filter", DualFilter), ("generator", DualGenerator))
    }
    reader = DualReader.func_or_class(Handle(stages["extractor"]), Handle(stages["filter"]),
                                      Handle(stages["generator"]), dual, EmbeddingConfig())  # fmt: skip
    reader.service = DualService(reader.pipeline, _BagEncoder(), None, dual)  # the bundled encoder is not needed here
    return reader


# -------------------------------------------------------------------------------------------- schemas


def test_strategy_field_on_both_requests_names_the_valid_ones():
    assert AnswerRequest(question="q", strategy="E&F").strategy == "E&F"
    assert AnswerRequest(question="q").strategy is None
    with pytest.raises(ValidationError, match="'R&B', 'R&L', 'Ext', 'Fil' or 'E&F'"):
        AnswerRequest(question="q", strategy="RAG")
    assert LongContextRequest(document=DOC, question=Q, strategy="Fil").strategy == "Fil"
    with pytest.raises(ValidationError, match="needs a question"):
        LongContextRequest(document=DOC, strategy="Fil")
    with pytest.raises(ValidationError, match="retriever are MixPR options"):
        LongContextRequest(document=DOC, question=Q, strategy="Fil", retriever="sparse")


# -------------------------------------------------------------------------------------------- deployments


def test_dual_reader_runs_each_stage_on_its_own_deployment_and_model():
    servers = {s: FakeLLMServer(f"model-{s}") for s in ("extractor", "filter", "generator")}
    reader = _reader(DualConfig(rerank_k=2, dense_candidates=5), servers)
    out = asyncio.run(reader.document(DOC, Q, "E&F")).to_dict()
    assert out["strategy"] == "E&F" and out["answer"] == "Poland" and len(out["chunks"]) == 2
    stages = out["trace"]["stages"]
    assert [(s["stage"], s["model"]) for s in stages] == [
        ("extractor", "model-extractor"), ("filter", "model-filter"), ("generator", "model-generator")]
    assert all(s["prompt_tokens"] > 0 and s["calls"] >= 1 for s in stages)
    assert out["trace"]["generator_input_tokens"] == 10 and out["trace"]["retrieval"]["mode"] == "dense only"
    assert servers["extractor"].calls == ["chat"] and servers["generator"].calls == ["chat"]
    assert servers["filter"].calls == ["chat", "chat_json", "chat_json"]  # CoT, then JSON-constrained judgements
    assert set(out["kept_chunk_ids"]) <= {c["position"] for c in out["chunks"]}

    rb = asyncio.run(reader.document(DOC, Q, "R&B", k=1)).to_dict()
    assert [s["stage"] for s in rb["trace"]["stages"]] == ["generator"] and len(rb["chunks"]) == 1
    only = asyncio.run(reader.document(DOC, Q, "Fil", retrieve_only=True)).to_dict()
    assert "answer" not in only and only["trace"]["n_paragraphs"] == 3
    with pytest.raises(ValueError, match="valid: R&B, R&L, Ext, Fil, E&F"):
        asyncio.run(reader.document(DOC, Q, "XYZ"))


def test_units_become_paragraphs_that_map_back_to_their_unit():
    paras = units_to_paragraphs([
        Unit("u7", ["d1", "d2"], ["Marie Curie", "Warsaw"], "Curie was born in Warsaw.\n\nWarsaw is in Poland.", 9),
        Unit("u8", [], [], "  ", 0),
    ])  # fmt: skip
    assert [(p.id, p.title) for p in paras] == [("u7/0", "Marie Curie"), ("u7/1", "Marie Curie")]


# -------------------------------------------------------------------------------------------- ingress


def _client(dual_reader: DualReader | None):
    """The ingress' real FastAPI app (routes, middlewares, error handlers) over a gateway whose
    handles are in-process objects: HTTP in process, no Serve."""
    from fastapi.testclient import TestClient

    from serve.api import create_api
    from serve.gateway import Gateway

    unit = RetrievedUnit(unit_id="u1", doc_ids=["d1"], titles=["Marie Curie"], score=0.9, shard=0, best_chunk_id="c0",
                         n_tokens=30, text=DOC)  # fmt: skip

    class _Encoder:
        async def encode(self, q):
            return [0.0]

    class _Retriever:
        async def retrieve(self, vector, k):
            return Retrieval(units=[unit], coverage=Coverage(shards=1, answered=1))

    class _Reader:
        async def read(self, *a):
            raise AssertionError("a strategy request must not reach the two-turn reader")

        async def run(self, *a):
            raise AssertionError("a strategy request must not reach the long-context reader")

    gw = Gateway(config=LongRAGConfig(), encoder=Handle(_Encoder()), retriever=Handle(_Retriever()),
                 reader=Handle(_Reader()), longcontext=Handle(_Reader()),
                 dual=None if dual_reader is None else Handle(dual_reader))
    return TestClient(create_api(gw))


def test_ingress_routes_strategy_requests_to_the_dual_reader():
    servers = {s: FakeLLMServer(s) for s in ("extractor", "filter", "generator")}
    with _client(_reader(DualConfig(rerank_k=2), servers)) as client:
        r = client.post("/v1/answer", json={"question": Q, "strategy": "Ext"})
        assert r.status_code == 200, r.text
        res = r.json()
        assert res["strategy"] == "Ext" and res["answer"] == "Poland" and res["long_answer"] == ""
        assert [s["stage"] for s in res["trace"]["dual"]["stages"]] == ["extractor", "generator"]
        assert res["trace"]["dual"]["global_information"] and res["evidence"][0]["used"]
        assert servers["filter"].calls == []

        r = client.post("/v1/longcontext", json={"document": DOC, "question": Q, "strategy": "Fil", "k": 2})
        assert r.status_code == 200, r.text
        lc = r.json()
        assert lc["strategy"] == "Fil" and lc["route"] is None and lc["answer"] == "Poland" and len(lc["chunks"]) == 2
        assert all(c["paragraph_id"] and c["paragraph_id"].startswith("doc/") for c in lc["chunks"])
        assert [s["stage"] for s in lc["trace"]["stages"]] == ["filter", "generator"] and "judgements" in lc["trace"]

    with _client(None) as client:
        r = client.post("/v1/answer", json={"question": Q, "strategy": "R&B"})
    assert r.status_code == 503 and "no dual-perspective deployments" in r.json()["error"]["message"]


def test_longrag_dual_model_on_chat_completions():
    servers = {s: FakeLLMServer(s) for s in ("extractor", "filter", "generator")}
    with _client(_reader(DualConfig(rerank_k=2, strategy="Fil"), servers)) as client:
        ask = {"model": "longrag-dual", "messages": [{"role": "user", "content": Q}]}
        r = client.post("/v1/chat/completions", json=ask)
        assert r.status_code == 200, r.text
        res = r.json()
        assert res["choices"][0]["message"]["content"] == "Poland" and res["model"] == "longrag-dual"
        stages = res["longrag"]["trace"]["dual"]["stages"]
        assert [s["stage"] for s in stages] == ["filter", "generator"]  # the default strategy: dual.strategy
        assert res["usage"]["prompt_tokens"] == sum(s["prompt_tokens"] for s in stages) > 0
        r = client.post("/v1/chat/completions", json=ask | {"strategy": "R&L"})
        assert [s["stage"] for s in r.json()["longrag"]["trace"]["dual"]["stages"]] == ["generator"]
