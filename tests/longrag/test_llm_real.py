"""The REAL bundled SmolLM2-135M-Instruct through llama.cpp, and the long reader on top of it.

Runs in the normal suite (one model load, short generations; well under a minute on 2 cores).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from longrag.config import LLMConfig, ReaderConfig
from longrag.llm import ContextOverflowError, LLMError, build_llm
from longrag.llm.llamacpp import LlamaCppLLM, resolve_model_path
from longrag.reading.reader import LongReader
from longrag.types import Unit

pytestmark = pytest.mark.slow  # a real model: left out of `make test-fast`

import llama_cpp  # noqa: E402,F401  (required: a failed compile fails the suite, never skips it)


@pytest.fixture(scope="module")
def llm() -> LlamaCppLLM:
    # Asks for more than SmolLM2's trained 8K window: the backend must clamp it.
    model = build_llm(LLMConfig(backend="llamacpp", model="smollm2-135m-instruct", context_window=16384, n_threads=1))
    assert isinstance(model, LlamaCppLLM)
    yield model
    asyncio.run(model.aclose())


def test_bundled_model_resolves_and_window_is_clamped(llm):
    path = resolve_model_path("smollm2-135m-instruct")
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert llm.context_window == 8192 and llm.is_chat_model and llm.name == "smollm2-135m-instruct"


def test_gguf_path_loads_with_its_own_window():
    path = resolve_model_path("smollm2-135m-instruct")
    model = LlamaCppLLM(str(path), n_ctx=512, n_threads=1)
    try:
        assert model.context_window == 512 and model.name == path.stem
        assert model.is_chat_model  # the GGUF carries a chat template
    finally:
        asyncio.run(model.aclose())
    with pytest.raises(LLMError, match="closed"):
        model.chat_sync([{"role": "user", "content": "hi"}], max_tokens=2)


def test_a_model_left_open_is_closed_at_exit_without_errors():
    """A process that exits holding a model: the atexit hook frees it while llama.cpp's module is
    whole (left to Llama.__del__ in finalization it prints "Exception ignored" tracebacks)."""
    script = (  # atexit runs last-in first-out: the check registered before the import runs after the hook
        "import atexit\n"
        "atexit.register(lambda: print('closed at exit:', m._llama is None, flush=True))\n"
        "from longrag.llm.llamacpp import LlamaCppLLM\n"
        "m = LlamaCppLLM('smollm2-135m-instruct', n_ctx=256, n_threads=1)\n"
    )
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "closed at exit: True" in proc.stdout, proc.stdout
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_close_is_idempotent():
    model = LlamaCppLLM("smollm2-135m-instruct", n_ctx=256, n_threads=1)
    model.close()
    model.close()
    asyncio.run(model.aclose())
    with pytest.raises(LLMError, match="closed"):
        model.chat_sync([{"role": "user", "content": "hi"}], max_tokens=2)


def test_token_counting_uses_the_model_tokenizer(llm):
    text = "Velmora is the capital city of Zorbland."
    n = llm.count_tokens(text)
    assert n == len(llm.tokenize(text)) and 5 < n < 20
    assert llm.detokenize(llm.tokenize(text)).strip() == text
    assert llm.count_tokens("") == 0
    assert llm.count_tokens(text + " " + text) > n


def test_truncation_cuts_where_the_word_search_does(llm):
    """The llama.cpp backend's cut (checked first where the n-th token ends) is the binary search's
    over word ends with the model's own counts (longrag.text.tokens.trim_to_tokens), multi-byte text too."""
    from longrag.llm.base import LLM
    from longrag.llm.vocab import LlamaVocab

    text = ("Zorbland's capital, Velmora, lies on the Ütze river; its 1,204 bridges — ice-blue — date from "
            "the 9th century. 東京 and Zürich are twinned with it. ") * 6
    total = llm.count_tokens(text)
    for n in (1, 2, 7, 40, total // 2, total - 1, total, total + 5):
        want = LLM.truncate_tokens(llm, text, n)  # the base class: the search alone
        assert llm.truncate_tokens(text, n) == want, n
        assert llm.count_tokens(want) <= n and text.startswith(want)
    assert llm.truncate_tokens(text, 0) == "" and llm.truncate_tokens(text, total) == text
    vocab = LlamaVocab.load("smollm2-135m-instruct")  # the remote LLM's fitter: vocabulary only
    assert vocab(text) == total and vocab.truncate(text, 40) == llm.truncate_tokens(text, 40)
    # the readers of one process share one vocabulary per model file (the single-machine app's five fitters)
    from longrag.models.bundled import resolve_model_path
    from serve.deployments import local_token_counter

    shared = LlamaVocab.shared("smollm2-135m-instruct")
    assert shared is LlamaVocab.shared(str(resolve_model_path("smollm2-135m-instruct"))) is not vocab
    cfg = LLMConfig(backend="llamacpp", model="smollm2-135m-instruct")
    assert local_token_counter(cfg) is local_token_counter(cfg) is shared
    assert shared(text) == total


def test_chat_real_tokens_deterministic_and_thread_safe(llm):
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]

    async def go():
        first = await llm.chat(messages, max_tokens=8)
        # two concurrent calls queue on the lock and give the same greedy output
        a, b = await asyncio.gather(llm.chat(messages, max_tokens=8), llm.chat(messages, max_tokens=8))
        return first, a, b

    first, a, b = asyncio.run(go())
    assert "paris" in first.text.lower()
    assert first.text == a.text == b.text
    # prompt tokens: the chat template adds role markers (and a default system prompt) around the content
    assert first.prompt_tokens > llm.count_tokens(messages[0]["content"])
    assert 1 <= first.completion_tokens <= 8
    assert first.latency_ms > 0 and first.model == "smollm2-135m-instruct"


def test_stream_chat_streams_what_chat_answers(llm):
    """llama.cpp's stream=True: several deltas that join to the greedy reply chat() gives, then a
    ChatResult with the same token counts."""
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]

    async def go():
        whole = await llm.chat(messages, max_tokens=16)
        items = [item async for item in llm.stream_chat(messages, max_tokens=16)]
        return whole, items

    whole, (*deltas, result) = asyncio.run(go())
    assert len(deltas) > 3 and all(isinstance(d, str) for d in deltas)
    assert "".join(deltas) == result.text == whole.text
    assert result.completion_tokens == whole.completion_tokens
    assert abs(result.prompt_tokens - whole.prompt_tokens) <= 1


def test_plain_completion(llm):
    res = asyncio.run(llm.complete("One, two, three, four,", max_tokens=4, stop=["\n"]))
    assert res.prompt_tokens == llm.count_tokens("One, two, three, four,")  # no BOS for this model
    assert 1 <= res.completion_tokens <= 4 and "five" in res.text.lower()


def test_context_overflow_is_reported(llm):
    with pytest.raises(ContextOverflowError, match="8192"):
        asyncio.run(llm.chat([{"role": "user", "content": "word " * 9000}], max_tokens=4))


def test_long_reader_answers_from_context(llm):
    units = [
        Unit(
            "u-zorbland",
            ["d2"],
            ["Zorbland"],
            "Zorbland is a small island nation in the Pacific Ocean. It became independent in 1962. "
            "Its largest export is coconut oil. The national sport of Zorbland is rowing.",
            0,
        ),
        Unit(
            "u-velmora",
            ["d1"],
            ["Velmora"],
            "Velmora is the capital city of Zorbland. About 80,000 people live there, and it is known "
            "for its harbour and fish markets.",
            0,
        ),
    ]
    # two_turn: SmolLM2-135M's direct reply to this prompt, evaluated in one pass, is the document's
    # opening ("Title: Zorbland\nZorbland is a small island nation"); it said "rowing" only while the
    # long answer's call ran first and its prompt's prefix came from that call's KV state (another
    # batch split). The direct reader with the default 0.5B is tested in test_reader_real.py.
    reader = LongReader(llm, ReaderConfig(answer="two_turn", long_answer_max_tokens=48, short_answer_max_tokens=16,
                                          few_shot_examples=3))
    res = asyncio.run(reader.read("What is the national sport of Zorbland?", units))
    assert res.answer.strip() and res.long_answer.strip()
    assert "rowing" in res.answer.lower(), res
    assert len(res.answer.split()) <= 6, res
    assert res.units_used == ["u-zorbland", "u-velmora"] and not res.truncated
    assert res.prompt_tokens > res.context_tokens > 0
    assert res.completion_tokens > 0
    assert res.stages_ms["total"] >= res.stages_ms["long_answer"] + res.stages_ms["short_answer"]


@pytest.mark.parametrize("cache_mb", [0, 64])
def test_next_turn_reuses_its_prefix_after_another_request(cache_mb):
    """A conversation's second turn takes its first turn from the KV cache; with a prompt cache that
    holds even when another conversation ran in between (as behind a Serve deployment)."""
    model = LlamaCppLLM("smollm2-135m-instruct", n_ctx=1024, n_threads=1, prompt_cache_mb=cache_mb)
    try:
        a = [{"role": "user", "content": "Describe the river Nile and the cities along it. " * 8}]
        b = [{"role": "user", "content": "List some animals that live in the Arctic tundra. " * 8}]
        a1 = model.chat_sync(a, max_tokens=4)
        model.chat_sync(b, max_tokens=4)  # another request in between
        a2 = model.chat_sync(a + [{"role": "assistant", "content": a1.text}, {"role": "user", "content": "Shorter."}],
                             max_tokens=4)
        if cache_mb:
            assert a2.cached_prompt_tokens >= a1.prompt_tokens - 2
            cache = model._llama.cache  # bounded for real: the saved logits count, one row each
            assert 0 < cache.cache_size <= cache_mb << 20
            assert all(state.scores.shape[0] == 1 for state in cache.cache_state.values())
        else:  # without the cache only the template's first tokens (its system prompt) are shared with b
            assert a2.cached_prompt_tokens < a1.prompt_tokens // 2
    finally:
        asyncio.run(model.aclose())


def test_prompt_cache_hits_keep_the_logits_buffer_small():
    """A prompt-cache hit restores a saved state without making llama-cpp-python's n_batch x
    vocabulary logits buffer resident (311 MB for the demo's Qwen2.5; 200 MB here, SmolLM2's 49K-token
    vocabulary at n_batch 1024, for ~1,100-token prompts): the process grows by the saved KV states
    only, which the 64 MB cache bounds."""
    import psutil

    model = LlamaCppLLM("smollm2-135m-instruct", n_ctx=2048, n_threads=1, n_batch=1024, prompt_cache_mb=64)
    try:
        a = [{"role": "user", "content": "Describe the river Nile and the cities along it. " * 100}]
        b = [{"role": "user", "content": "List some animals that live in the Arctic tundra. " * 100}]
        a1 = model.chat_sync(a, max_tokens=4)
        model.chat_sync(b, max_tokens=4)
        before = psutil.Process().memory_info().rss
        hits = []
        for turn in range(2):  # each turn restores the conversation's saved prefix from the cache
            model.chat_sync(b, max_tokens=4)
            msgs = a + [{"role": "assistant", "content": a1.text}, {"role": "user", "content": f"Shorter, {turn}."}]
            hits.append(model.chat_sync(msgs, max_tokens=4).cached_prompt_tokens)
        grown = psutil.Process().memory_info().rss - before
        vocab_buffer = 1024 * model._llama.n_vocab() * 4
        assert min(hits) >= a1.prompt_tokens - 2, hits
        assert grown < vocab_buffer // 2, (grown, vocab_buffer)
    finally:
        asyncio.run(model.aclose())


def test_cold_reads_evaluate_every_prompt_whole():
    """forget_prefixes / cold_reads (the benchmarks' fairness between prompts): the same prompt
    again reuses the KV cache by default, and is evaluated whole after forget_prefixes or with
    cold_reads on -- also with a RAM prompt cache that holds it."""
    model = LlamaCppLLM("smollm2-135m-instruct", n_ctx=1024, n_threads=1, prompt_cache_mb=64)
    try:
        msgs = [{"role": "user", "content": "Name the planets of the solar system in order. " * 6}]
        first = model.chat_sync(msgs, max_tokens=4)
        assert first.cached_prompt_tokens <= 1  # llama.cpp's counters: the whole prompt evaluated (give or take its last token)
        assert model.chat_sync(msgs, max_tokens=4).cached_prompt_tokens >= first.prompt_tokens - 2
        model.forget_prefixes()
        assert model.chat_sync(msgs, max_tokens=4).cached_prompt_tokens <= 1
        model.cold_reads = True
        again = [model.chat_sync(msgs, max_tokens=4) for _ in range(2)]
        assert all(r.cached_prompt_tokens <= 1 for r in again), again
        assert len({r.text for r in [first, *again]}) == 1  # greedy and cold: the same reply each time
    finally:
        asyncio.run(model.aclose())


def test_a_cached_state_llama_cpp_refuses_is_purged_and_evaluated_again(tmp_path):
    """A unit-cache entry whose state llama.cpp's ``llama_state_set_data`` refuses (cut in half here)
    failed its request and every later one for its unit, the context left claiming the prefix. Now
    it is evaluated again with the answer of a miss, and replaced in both tiers by a good state."""
    from dataclasses import replace

    from longrag.llm.kvcache import PrefixStateCache

    cache = PrefixStateCache(64 << 20, 64 << 20, tmp_path)
    model = LlamaCppLLM("smollm2-135m-instruct", n_ctx=1024, n_threads=1, unit_cache=cache)
    try:
        head = "Documents:\n" + "The river Nile flows north through Egypt into the Mediterranean Sea. " * 4
        msgs = [{"role": "user", "content": head + "\nQuestion: Into which sea does the Nile flow?"}]
        first = model.chat_sync(msgs, max_tokens=8, cache_prefix=head)
        assert first.prefix_cache == "miss"
        (path,) = tmp_path.glob("*.kv.npz")
        key = path.name[: -len(".kv.npz")]
        good, _ = cache.get(key)
        cache.clear()
        path.unlink()
        cache.put(key, replace(good, state=good.state[: len(good.state) // 2]))  # both tiers
        model.forget_prefixes()  # another request ran in between
        again = model.chat_sync(msgs, max_tokens=8, cache_prefix=head)
        assert again.prefix_cache == "miss" and again.text == first.text
        assert cache.stats.discarded == 1
        cache.clear()  # the fresh state is on disk, whole
        stored, where = cache.get(key)
        assert where == "disk" and len(stored.state) == len(good.state)
        model.forget_prefixes()
        third = model.chat_sync(msgs, max_tokens=8, cache_prefix=head)
        assert third.prefix_cache == "ram" and third.text == first.text
    finally:
        asyncio.run(model.aclose())
