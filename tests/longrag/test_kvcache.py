"""The unit KV cache (longrag.llm.kvcache): its tiers and budgets with small fake states here; with
the REAL bundled reader, that a hit gives the same answer and first-token logits as a cold read
(marked slow: one model load)."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from longrag.llm.kvcache import PrefixState, PrefixStateCache


def state(n_tokens: int, fill: int = 1, state_bytes: int = 1000) -> PrefixState:
    return PrefixState(tokens=np.arange(n_tokens, dtype=np.int32), state=bytes([fill % 256]) * state_bytes,
                       scores=np.full((1, 10), fill, dtype=np.float32), seed=fill)


def test_ram_tier_keeps_the_most_recently_used_within_its_budget():
    one = state(10).nbytes
    cache = PrefixStateCache(ram_bytes=3 * one)
    for k in "abc":
        cache.put(k, state(10))
    assert cache.get("a")[1] == "ram"  # a is now the most recent: b goes first
    cache.put("d", state(10))
    assert [cache.get(k)[1] for k in "abcd"] == ["ram", "miss", "ram", "ram"]
    s = cache.stats
    assert s.ram_entries == 3 and s.ram_bytes == 3 * one and s.ram_peak_bytes <= 3 * one and s.ram_evictions == 1
    assert (s.ram_hits, s.misses) == (4, 1) and s.hit_rate == pytest.approx(0.8)
    cache.put("huge", state(10, state_bytes=4 * one))  # larger than the whole budget: not kept
    assert cache.get("huge")[1] == "miss" and cache.stats.ram_entries == 3


def test_disk_tier_is_written_through_read_back_and_outlives_the_process(tmp_path):
    one = state(10).nbytes
    cache = PrefixStateCache(ram_bytes=one, disk_bytes=10 * one, disk_dir=tmp_path)
    cache.put("a", state(10, fill=7))
    cache.put("b", state(10, fill=8))  # a leaves RAM, stays on disk
    entry, where = cache.get("a")
    assert where == "disk" and entry.state == state(10, fill=7).state and entry.seed == 7
    np.testing.assert_array_equal(entry.tokens, np.arange(10))
    assert cache.get("a")[1] == "ram"  # promoted
    again = PrefixStateCache(ram_bytes=one, disk_bytes=10 * one, disk_dir=tmp_path)  # a restarted replica
    assert again.stats.disk_entries == 2 and again.get("b")[1] == "disk"


def test_disk_tier_evicts_the_least_recently_used_files_within_its_budget(tmp_path):
    one = state(10).nbytes
    probe = PrefixStateCache(ram_bytes=one, disk_bytes=10 * one, disk_dir=tmp_path / "probe")
    probe.put("x", state(10))
    file_bytes = probe.stats.disk_bytes  # the npz's own overhead included
    cache = PrefixStateCache(ram_bytes=one, disk_bytes=3 * file_bytes + 10, disk_dir=tmp_path)
    for i, k in enumerate("abc"):
        cache.put(k, state(10, fill=i))
        os.utime(tmp_path / f"{k}.kv.npz", (time.time() - 100 + i, time.time() - 100 + i))
    cache.clear()
    assert cache.get("a")[1] == "disk"  # touched: b is now the oldest file
    cache.put("d", state(10))
    files = sorted(p.name for p in tmp_path.glob("*.kv.npz"))
    assert files == ["a.kv.npz", "c.kv.npz", "d.kv.npz"], files
    assert cache.stats.disk_bytes <= cache.disk_budget and cache.stats.disk_peak_bytes <= cache.disk_budget


def test_an_unreadable_file_is_a_miss_and_is_removed(tmp_path):
    one = state(10).nbytes
    cache = PrefixStateCache(ram_bytes=one, disk_bytes=10 * one, disk_dir=tmp_path)
    cache.put("a", state(10))
    cache.clear()
    (tmp_path / "a.kv.npz").write_bytes(b"not an npz")
    assert cache.get("a") == (None, "miss")
    assert not (tmp_path / "a.kv.npz").exists() and cache.stats.disk_errors == 1


def test_budgets_are_checked():
    with pytest.raises(ValueError):
        PrefixStateCache(ram_bytes=0)
    with pytest.raises(ValueError, match="disk_dir"):
        PrefixStateCache(ram_bytes=10, disk_bytes=10)


def test_the_reader_hands_its_top_unit_as_the_cache_prefix():
    from longrag.reading.prompts import direct_messages, documents_head, format_context, turn1_messages
    from longrag.reading.reader import LongReader
    from longrag.types import Unit
    from tests.fakes import ScriptedLLM

    units = [Unit("u1", ["d1"], ["A"], "alpha " * 20, 20), Unit("u2", ["d2"], ["B"], "beta " * 20, 20)]
    llm = ScriptedLLM(["A", "The answer is A."])
    asyncio.run(LongReader(llm).read("which?", units))
    head = llm.calls[0]["cache_prefix"]
    assert head == documents_head(["Title: A\n" + "alpha " * 19 + "alpha"]) and head.endswith("alpha")
    assert all(c["cache_prefix"] == head for c in llm.calls)
    context = format_context(["Title: A\n" + ("alpha " * 20).strip(), "Title: B\n" + ("beta " * 20).strip()])
    for messages in (direct_messages("which?", context), turn1_messages("which?", context)):
        assert messages[-1]["content"].startswith(head)


# -- the real reader ----------------------------------------------------------------------------


def _chatml(messages: list[dict]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


@pytest.mark.slow
def test_a_hit_reads_like_a_cold_run_with_the_real_reader(tmp_path):
    """Same greedy answer as a cold read, with the state from RAM and from disk; first-token logits
    equal to the bit to a cold run split as the hit splits, and within float tolerance of one whole
    evaluation (the batch split reorders sums); a hit takes exactly the prefix's tokens."""
    from longrag.config import LLMConfig
    from longrag.llm.factory import build_llm
    from longrag.reading.prompts import direct_messages, documents_head, format_context, format_unit
    from longrag.types import Unit

    top = Unit("u-af", ["d1"], ["Animal Farm"], "Animal Farm is a satirical allegorical novella by George Orwell, "
               "first published in England on 17 August 1945. It tells the story of farm animals who rebel "
               "against their human farmer, hoping to create a society where the animals can be equal.", 60)
    other = [Unit("u-ar", ["d3"], ["Aruba"], "Aruba is an island country in the southern Caribbean Sea.", 12),
             Unit("u-b", ["d4"], ["The Beatles"], "The Beatles were an English rock band formed in Liverpool.", 12)]
    blocks = [[format_unit(top), format_unit(u)] for u in other]
    head = documents_head(blocks[0])
    first = direct_messages("Who wrote Animal Farm?", format_context(blocks[0]))
    second = direct_messages("When was Animal Farm first published?", format_context(blocks[1]))

    cfg = LLMConfig(context_window=2048, n_threads=2, prompt_cache_mb=0, unit_cache_mb=64, unit_cache_disk_mb=64,
                    unit_cache_dir=str(tmp_path))
    llm = build_llm(cfg)
    try:
        cold = llm.chat_sync(second, max_tokens=16)  # no cache_prefix: evaluated whole
        cold_logits = llm.next_token_logits(second)
        assert cold.prefix_cache == ""
        llm.forget_prefixes()
        assert llm.chat_sync(first, max_tokens=8, cache_prefix=head).prefix_cache == "miss"
        llm.forget_prefixes()  # another question ran in between: the context no longer holds the unit
        hit = llm.chat_sync(second, max_tokens=16, cache_prefix=head)
        # the prefix: the common tokens of the prompt and of the prompt cut after the top unit, both
        # written out in ChatML here and tokenized by the model
        full, cut = (llm._llama.tokenize(_chatml(m).encode(), special=True)
                     for m in (second, second[:-1] + [{"role": "user", "content": head}]))
        prefix = next(i for i, (a, b) in enumerate(zip(full, cut)) if a != b)
        assert hit.prefix_cache == "ram" and hit.text == cold.text
        assert hit.cached_prompt_tokens == prefix > 60
        llm.forget_prefixes()
        hit_logits = llm.next_token_logits(second, cache_prefix=head)
        # a cold run split where the hit splits (the prefix, then the rest), by llama.cpp's own calls:
        # the logits are the same to the bit, so the loaded state is the evaluated one
        raw = llm._llama
        raw.reset()
        raw.eval(full[:prefix])
        raw.eval(full[prefix:])
        split_logits = np.ctypeslib.as_array(raw._ctx.get_logits(), shape=(raw.n_vocab(),)).copy()
        np.testing.assert_array_equal(hit_logits, split_logits)
        # against one whole evaluation only the batch split differs (~0.3 of logits near 20 here, the
        # same at any split point): the same first token, and the same greedy answer above
        assert int(np.argmax(hit_logits)) == int(np.argmax(cold_logits))
        np.testing.assert_allclose(hit_logits, cold_logits, rtol=0, atol=0.05 * float(np.abs(cold_logits).max()))
        stats = llm.unit_cache.stats
        assert stats.ram_bytes <= stats.ram_peak_bytes <= 64 << 20 and stats.largest_entry_bytes > 0
    finally:
        llm.close()
    again = build_llm(cfg)  # a restarted replica: the state comes from the disk tier
    try:
        res = again.chat_sync(second, max_tokens=16, cache_prefix=head)
        assert res.prefix_cache == "disk" and res.text == cold.text
    finally:
        again.close()
    off = build_llm(cfg.model_copy(update={"unit_cache_mb": 0}))  # no cache: the same split, the same bits
    try:
        assert off.unit_cache is None
        np.testing.assert_array_equal(off.next_token_logits(second, cache_prefix=head), hit_logits)
    finally:
        off.close()
