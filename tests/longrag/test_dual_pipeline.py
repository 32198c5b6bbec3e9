"""Dual-perspective pipeline: paragraph mapping, filter JSON parsing and keep-all fallback, and every
strategy over a scripted LLM (what each stage is sent and what reaches the generator)."""

from __future__ import annotations

import asyncio

import pytest

from longrag.config import DualConfig
from longrag.dual.chunking import DualChunk, SourceParagraph
from longrag.dual.paragraphs import index_paragraphs, map_to_paragraphs
from longrag.dual.pipeline import STRATEGIES, DualPipeline
from longrag.dual.prompts import JUDGEMENT_SCHEMA, parse_judgement
from longrag.dual.rerank import ChunkRetrieval, RetrievalTrace, RetrievedChunk
from tests.fakes import ScriptedLLM
from tests.longrag.test_dual_retrieval import _BagEncoder


def _chunk(cid: int, pid: str, text: str) -> DualChunk:
    return DualChunk(cid, pid, text, 0, 1, 0, len(text), len(text.split()))


PARAS = {
    "a/0": SourceParagraph("a/0", "Marie Curie was born in Warsaw. She later moved to Paris to study.", "Marie Curie"),
    "b/0": SourceParagraph("b/0", "Warsaw is the capital of Poland. It lies on the Vistula.", "Warsaw"),
    "c/0": SourceParagraph("c/0", "Bananas are rich in potassium.", "Banana"),
}


def _retrieval() -> ChunkRetrieval:
    chunks = [
        RetrievedChunk(_chunk(0, "a/0", "Marie Curie was born in Warsaw."), 0.9),
        RetrievedChunk(_chunk(1, "b/0", "Warsaw is the capital of Poland."), 0.8),
        RetrievedChunk(_chunk(2, "a/0", "She later moved to Paris to study."), 0.95),
        RetrievedChunk(_chunk(3, "c/0", "Bananas are rich in potassium."), 0.1),
    ]
    return ChunkRetrieval(chunks, RetrievalTrace("dense only", None, 4, 4, 4, notes=["no reranker configured"]))


def _stage_reply(judge=lambda passage: '{"status": true}'):
    """A fake LLM that answers by the stage its prompt belongs to."""

    def reply(messages):
        user = messages[-1]["content"]
        if user.startswith("Background:"):
            return "Curie was born in Warsaw, the capital of Poland."
        if "reason step by step" in user:
            return "Find Curie's birthplace, then its country."
        if user.startswith("Passage:"):
            return judge(user.split("\n\nQuestion:")[0])
        return "Poland\nextra words"

    return reply


def _run(llm, strategy, retrieval=None, cfg=None):
    pipe = DualPipeline(llm, cfg or DualConfig())
    return asyncio.run(pipe.run("In which country was Marie Curie born?", retrieval or _retrieval(), PARAS, strategy))


def _kinds(llm) -> list[str]:
    out = []
    for c in llm.calls:
        u = c["messages"][-1]["content"]
        out.append("ext" if u.startswith("Background:") else "cot" if "step by step" in u
                   else "judge" if u.startswith("Passage:") else "gen")  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------ pure parts


def test_map_to_paragraphs_keeps_best_chunk_per_shared_source():
    mapped = map_to_paragraphs(_retrieval().chunks, PARAS)
    assert [p.id for p, _ in mapped] == ["a/0", "b/0", "c/0"]
    assert mapped[0][1].chunk.chunk_id == 2  # of the two a/0 chunks, the higher-scored one
    with pytest.raises(KeyError, match="unknown paragraph 'zz'"):
        map_to_paragraphs([RetrievedChunk(_chunk(9, "zz", "x"), 1.0)], PARAS)


@pytest.mark.parametrize(
    "text,expected",
    [
        ('{"status": true}', True),
        ('{"status": false}', False),
        ('Sure! {"status": "True"} because ...', True),
        ('```json\n{"status": "false"}\n```', False),
        ("False", False),
        ("yes, cite it", True),
        ('{"status": 3}', None),
        ("I cannot tell.", None),
        ("", None),
    ],
)
def test_parse_judgement(text, expected):
    assert parse_judgement(text) is expected


# ------------------------------------------------------------------------------------------ strategies


def test_rb_generates_from_retrieved_chunks_only():
    llm = ScriptedLLM([_stage_reply()])
    res = _run(llm, "R&B")
    assert _kinds(llm) == ["gen"] and res.answer == "Poland"
    gen = llm.calls[0]["messages"][-1]["content"]
    assert "Bananas are rich" in gen and "She later moved" in gen and "Global information" not in gen
    assert res.kept_chunk_ids == [0, 1, 2, 3] and res.global_information is None and res.cot is None
    assert [s.stage for s in res.stages] == ["generator"]
    assert res.generator_input_tokens == llm.count_message_tokens(llm.calls[0]["messages"])
    assert res.to_dict()["trace"]["retrieval"]["mode"] == "dense only"


def test_rl_generates_from_source_paragraphs():
    llm = ScriptedLLM([_stage_reply()])
    res = _run(llm, "R&L")
    gen = llm.calls[0]["messages"][-1]["content"]
    # whole paragraphs with titles, each once, even though two chunks came from a/0
    assert gen.count("Marie Curie was born in Warsaw. She later moved to Paris to study.") == 1
    assert "Warsaw\nWarsaw is the capital of Poland. It lies on the Vistula." in gen
    assert res.paragraph_ids == ["a/0", "b/0", "c/0"]
    rb = _run(ScriptedLLM([_stage_reply()]), "R&B")
    assert res.generator_input_tokens > rb.generator_input_tokens


def test_ext_adds_global_information_from_mapped_paragraphs():
    llm = ScriptedLLM([_stage_reply()] * 2)
    res = _run(llm, "Ext")
    assert _kinds(llm) == ["ext", "gen"]
    ext = llm.calls[0]["messages"][-1]["content"]
    assert "It lies on the Vistula." in ext and "In which country" in ext
    gen = llm.calls[1]["messages"][-1]["content"]
    assert gen.startswith("Global information:\nCurie was born in Warsaw, the capital of Poland.")
    assert "Bananas are rich" in gen  # Ext keeps every chunk
    assert [s.stage for s in res.stages] == ["extractor", "generator"]
    assert res.stages[0].calls == 1 and res.stages[0].prompt_tokens > 0 and res.stages[0].completion_tokens > 0
    assert "4 chunks -> 3 source paragraphs" in res.stages[0].notes


def _no_bananas(passage: str) -> str:
    return '{"status": false}' if "Bananas" in passage else '{"status": true}'


def test_fil_drops_chunks_judged_false_with_one_cot_and_one_judgement_per_chunk():
    llm = ScriptedLLM([_stage_reply(_no_bananas)] * 6)
    res = _run(llm, "Fil")
    assert _kinds(llm) == ["cot"] + ["judge"] * 4 + ["gen"]
    cot_prompt = llm.calls[0]["messages"][-1]["content"]
    assert all(t in cot_prompt for t in ("Marie Curie was born", "Bananas are rich"))
    judge_prompts = [c["messages"][-1]["content"] for c in llm.calls[1:5]]
    assert all("Find Curie's birthplace" in p for p in judge_prompts)  # the CoT guides every judgement
    assert res.kept_chunk_ids == [0, 1, 2]
    assert "Bananas" not in llm.calls[-1]["messages"][-1]["content"]
    f = res.stages[0]
    assert f.stage == "filter" and f.calls == 5
    assert any("not constrained" in n for n in f.notes)  # ScriptedLLM has no JSON schema support
    assert [j.keep for j in res.judgements] == [True, True, True, False]


def test_filter_keeps_all_when_nothing_is_kept_and_says_so():
    llm = ScriptedLLM([_stage_reply(lambda p: '{"status": false}')] * 6)
    res = _run(llm, "Fil")
    assert res.kept_chunk_ids == [0, 1, 2, 3]
    assert "filter kept no chunk: keeping all 4" in res.stages[0].notes


def test_filter_keeps_unparseable_judgements():
    replies = {"Marie Curie was born": "hmm", "Bananas": '{"status": false}'}

    def judge(passage):
        return next((v for k, v in replies.items() if k in passage), '{"status": false}')

    res = _run(ScriptedLLM([_stage_reply(judge)] * 6), "Fil")
    assert res.kept_chunk_ids == [0]
    assert any("1 judgement(s) unparseable, chunks kept: [0]" in n for n in res.stages[0].notes)


def test_ef_uses_global_information_and_filtered_chunks():
    llm = ScriptedLLM([_stage_reply(_no_bananas)] * 7)
    res = _run(llm, "E&F")
    assert sorted(_kinds(llm)) == sorted(["ext", "cot", "judge", "judge", "judge", "judge", "gen"])
    assert _kinds(llm)[-1] == "gen"
    gen = llm.calls[-1]["messages"][-1]["content"]
    assert gen.startswith("Global information:") and "Bananas" not in gen
    assert [s.stage for s in res.stages] == ["extractor", "filter", "generator"]
    d = res.to_dict()
    assert d["trace"]["generator_input_tokens"] == res.generator_input_tokens > 0
    assert d["kept_chunk_ids"] == [0, 1, 2] and d["global_information"] and d["cot"]


def test_unknown_strategy_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown strategy 'RAG'; valid: R&B, R&L, Ext, Fil, E&F"):
        _run(ScriptedLLM(), "RAG")
    assert STRATEGIES == ("R&B", "R&L", "Ext", "Fil", "E&F")


def test_strategy_default_comes_from_config():
    llm = ScriptedLLM([_stage_reply()] * 2)
    res = _run(llm, None, cfg=DualConfig(strategy="Ext"))
    assert res.strategy == "Ext" and _kinds(llm) == ["ext", "gen"]


def test_long_context_is_cut_to_fit_the_window_and_noted():
    llm = ScriptedLLM([_stage_reply()], context_window=66)
    cfg = DualConfig(generator_max_tokens=8, context_reserve_tokens=0)
    res = _run(llm, "R&L", cfg=cfg)
    assert llm.count_message_tokens(llm.calls[0]["messages"]) + 8 <= 66
    assert any("2 of 3 texts cut or dropped to fit" in n for n in res.stages[-1].notes)
    assert "Marie Curie was born" in llm.calls[0]["messages"][-1]["content"]


def test_json_judgements_use_the_schema_where_supported():
    class JsonLLM(ScriptedLLM):
        supports_json_schema = True

        async def chat_json(self, messages, *, schema, max_tokens, temperature=None):
            self.schemas.append(schema)
            return await self.chat(messages, max_tokens=max_tokens, temperature=temperature)

    llm = JsonLLM([_stage_reply()] * 6)
    llm.schemas = []
    res = _run(llm, "Fil")
    assert llm.schemas == [JUDGEMENT_SCHEMA] * 4
    assert any("constrained to JSON" in n for n in res.stages[0].notes)


def test_answer_over_an_index_retrieves_then_runs():
    cfg = DualConfig(chunk_words=20, rerank_k=2, dense_candidates=3)
    index = index_paragraphs(list(PARAS.values()), _BagEncoder(), None, cfg)
    llm = ScriptedLLM([_stage_reply()])
    res = asyncio.run(DualPipeline(llm, cfg).answer("Where was Marie Curie born?", index, "R&B"))
    assert len(res.retrieved) == 2 and res.retrieval["mode"] == "dense only"


def test_stages_can_run_on_other_models():
    """Section 5.4: small models for the extractor and filter, another for the generator; each
    stage's trace names its model, and the pipeline's own LLM is not needed."""
    small = ScriptedLLM([], name="small")
    small._next = lambda messages: _stage_reply()(messages)  # type: ignore[method-assign]
    big = ScriptedLLM([], default="Poland", name="big")
    cfg = DualConfig()
    e_and_f = DualPipeline(small, cfg)
    pipe = DualPipeline(None, cfg, extractor=e_and_f, filter=e_and_f, generator=DualPipeline(big, cfg))
    res = asyncio.run(pipe.run("In which country was Marie Curie born?", _retrieval(), PARAS, "E&F"))
    assert [(st.stage, st.model) for st in res.stages] == [("extractor", "small"), ("filter", "small"),
                                                            ("generator", "big")]  # fmt: skip
    assert res.answer == "Poland" and len(big.calls) == 1 and _kinds(small).count("gen") == 0
    with pytest.raises(ValueError, match="needs an llm"):
        DualPipeline(None, cfg, extractor=e_and_f)
