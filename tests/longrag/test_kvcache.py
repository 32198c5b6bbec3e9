"""The unit KV cache (longrag.llm.kvcache): its tiers and budgets with small fake states here; with
the REAL bundled reader, that a hit gives the same answer and first-token logits as a cold read
(marked slow: one model load)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import stat
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

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


def folder_bytes(folder: Path) -> int:
    """What the folder really holds (states and temporary files; the lock file is empty)."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def one_file_bytes(tmp_path: Path, entry: PrefixState) -> int:
    """The size of ``entry``'s file (the npz's own overhead included)."""
    probe = PrefixStateCache(ram_bytes=1 << 20, disk_bytes=1 << 20, disk_dir=tmp_path / "probe")
    probe.put("x", entry)
    return probe.stats.disk_bytes


@pytest.mark.parametrize("damage", ["torn", "bit-flipped", "cut to its header"])
def test_a_damaged_file_is_a_miss_and_is_removed(tmp_path, damage):
    """A crash mid-write (torn) or a bad sector (a flipped bit in the state: the zip's CRC) raised
    BadZipFile out of every lookup of the unit, and the file stayed to fail the next one."""
    cache = PrefixStateCache(ram_bytes=1 << 20, disk_bytes=1 << 20, disk_dir=tmp_path)
    cache.put("a", state(10, state_bytes=4000))
    cache.clear()
    path = tmp_path / "a.kv.npz"
    raw = bytearray(path.read_bytes())
    if damage == "torn":
        raw = raw[: len(raw) // 2]
    elif damage == "bit-flipped":
        at = raw.index(bytes([1]) * 4000) + 2000  # inside the state's bytes
        raw[at] ^= 0x10
    else:
        raw = raw[:40]
    path.write_bytes(bytes(raw))
    assert cache.get("a") == (None, "miss")
    assert not path.exists() and cache.stats.disk_errors == 1 and cache.stats.misses == 1
    cache.put("a", state(10, state_bytes=4000))  # written again, and whole
    cache.clear()
    assert cache.get("a")[1] == "disk"


def test_a_write_fsyncs_the_file_before_its_rename_and_the_folder_after(tmp_path, monkeypatch):
    """Without the fsyncs a crash soon after a put can leave a renamed file whose data never reached
    the disk: a torn state under the real name."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append("rename")
        real_replace(src, dst)

    cache = PrefixStateCache(ram_bytes=1 << 20, disk_bytes=1 << 20, disk_dir=tmp_path)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    cache.put("a", state(10))
    assert events == ["fsync file", "rename", "fsync folder"]
    assert cache.get("a")[1] == "ram" and (tmp_path / "a.kv.npz").is_file()


def test_the_disk_peak_is_what_the_folder_held_and_stays_within_the_budget(tmp_path, monkeypatch):
    """Room is made before a file is written, so the folder never holds more than its budget; the
    peak is sampled right after each write (it was sampled after eviction, blind to the overshoot)."""
    file_bytes = one_file_bytes(tmp_path, state(10))
    folder = tmp_path / "kv"
    cache = PrefixStateCache(ram_bytes=1 << 20, disk_bytes=3 * file_bytes + 10, disk_dir=folder)
    held: list[int] = []
    real_replace = os.replace

    def replace(src, dst) -> None:
        real_replace(src, dst)
        held.append(folder_bytes(folder))  # the moment a new file has its name, nothing evicted after it

    monkeypatch.setattr(os, "replace", replace)
    for i in range(6):
        cache.put(f"k{i}", state(10, fill=i))
    assert len(held) == 6 and max(held) <= cache.disk_budget, held
    assert cache.stats.disk_peak_bytes == max(held) and cache.stats.disk_evictions == 3
    assert cache.stats.disk_bytes == folder_bytes(folder) and cache.stats.disk_entries == 3


def test_the_disk_budget_is_the_folders_across_instances(tmp_path):
    """Two replicas of a node on one folder: each trusted its own list of files, so together they
    filled twice the budget. Eviction now rescans the folder under its lock."""
    file_bytes = one_file_bytes(tmp_path, state(10))
    folder = tmp_path / "kv"
    budget = 3 * file_bytes + 10
    a, b = (PrefixStateCache(ram_bytes=1 << 20, disk_bytes=budget, disk_dir=folder) for _ in range(2))
    for i in range(8):
        (a if i % 2 else b).put(f"k{i}", state(10, fill=i))
        assert folder_bytes(folder) <= budget, i
    assert len(list(folder.glob("*.kv.npz"))) == 3
    assert max(a.stats.disk_peak_bytes, b.stats.disk_peak_bytes) <= budget
    # what one replica wrote, the other finds on disk (the files are the folder's, not a process's)
    assert a.get("k6")[1] == "disk" and b.get("k7")[1] == "disk"


def _fill(folder: str, budget: int, tag: str, n: int, barrier: Any, results: Any) -> None:
    """A replica's process: opens the cache, waits for the other, then ``n`` puts into the folder."""
    cache = PrefixStateCache(ram_bytes=1 << 20, disk_bytes=budget, disk_dir=folder)
    barrier.wait(timeout=60)
    for i in range(n):
        cache.put(f"{tag}{i}", state(10, fill=i))
    results.put((tag, cache.stats.disk_peak_bytes, cache.stats.disk_errors))


def test_the_disk_budget_is_the_folders_across_processes(tmp_path):
    """The same with two processes, both open before either writes, then writing at once."""
    file_bytes = one_file_bytes(tmp_path, state(10))
    folder = tmp_path / "kv"
    budget = 4 * file_bytes + 10
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_fill, args=(str(folder), budget, tag, 12, barrier, results)) for tag in "ab"]
    for proc in procs:
        proc.start()
    out = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert all(peak <= budget and errors == 0 for _, peak, errors in out), out
    names = [p.name for p in folder.iterdir()]
    assert folder_bytes(folder) <= budget and len([n for n in names if n.endswith(".kv.npz")]) == 4, names
    assert not [n for n in names if n.endswith(".tmp")], names


def test_orphaned_temporary_files_are_removed_under_the_folder_lock(tmp_path):
    """A writer killed between its temporary file and the rename left the file there for good.
    Writers hold the folder's lock from the temporary file's creation to its rename, so one found
    while holding the lock is an orphan; one found while another process holds it may be alive."""
    from filelock import FileLock

    folder = tmp_path / "kv"
    folder.mkdir()
    orphans = [folder / "k.abc123.kv.tmp", folder / "tmpq8z1.tmp"]  # ours, and an earlier version's
    for path in orphans:
        path.write_bytes(b"x" * 100)
    (folder / "notes.txt").write_text("not the cache's")
    with FileLock(str(folder / ".kv.lock")):  # a live writer elsewhere: its temporary files stay
        busy = PrefixStateCache(ram_bytes=1 << 20, disk_bytes=1 << 20, disk_dir=folder, lock_timeout_s=0.2)
        assert all(p.exists() for p in orphans) and busy.stats.disk_errors == 1
    cache = PrefixStateCache(ram_bytes=1 << 20, disk_bytes=1 << 20, disk_dir=folder)  # on open
    assert not any(p.exists() for p in orphans) and (folder / "notes.txt").exists()
    assert cache.stats.orphans_removed == 2
    later = folder / "k2.def456.kv.tmp"
    later.write_bytes(b"x")
    cache.put("a", state(10))  # and on every write
    assert not later.exists() and cache.stats.orphans_removed == 3


def test_discard_removes_both_copies(tmp_path):
    cache = PrefixStateCache(ram_bytes=1 << 20, disk_bytes=1 << 20, disk_dir=tmp_path)
    cache.put("a", state(10))
    cache.put("b", state(10, fill=2))
    cache.discard("a")
    assert cache.get("a") == (None, "miss") and not (tmp_path / "a.kv.npz").exists()
    assert cache.get("b")[1] == "ram" and cache.stats.discarded == 1
    assert cache.stats.disk_entries == 1 and cache.stats.disk_bytes == folder_bytes(tmp_path)
    cache.discard("never-stored")  # nothing to remove: no error
    assert cache.stats.discarded == 2


# -- the llama.cpp backend's use of the cache, on a fake context ---------------------------------


class FakeLlama:
    """What the unit-cache path of :class:`LlamaCppLLM` touches of ``llama_cpp.Llama``; its "KV
    memory" is the token ids it evaluated. ``refuse_loads``: ``load_state`` fails as
    llama-cpp-python's does when ``llama_state_set_data`` refuses the bytes -- after it has set the
    context's tokens."""

    chat_format = "chatml"

    def __init__(self, n_ctx: int = 256, **params: object) -> None:
        self._n_ctx = n_ctx
        self.context_params = SimpleNamespace(**{"n_batch": 64, "n_ubatch": 64, "n_seq_max": 1, "type_k": 1,
                                                 "type_v": 1, "flash_attn_type": -1, "swa_full": True,
                                                 "kv_unified": False, **params})
        self.input_ids = np.zeros(n_ctx, dtype=np.intc)
        self.n_tokens = 0
        self.memory: list[int] = []
        self.refuse_loads = False
        self.calls: list[str] = []
        self._ctx = SimpleNamespace(kv_cache_clear=self._clear)

    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def _input_ids(self) -> np.ndarray:
        return self.input_ids[: self.n_tokens]

    def _clear(self) -> None:
        self.calls.append("clear")
        self.memory = []

    def reset(self) -> None:
        self.calls.append("reset")
        self.n_tokens = 0

    def eval(self, tokens: list[int]) -> None:
        self.calls.append("eval")
        self.memory = self.memory[: self.n_tokens] + list(tokens)
        self.input_ids[self.n_tokens: self.n_tokens + len(tokens)] = tokens
        self.n_tokens += len(tokens)

    def save_state(self) -> SimpleNamespace:
        return SimpleNamespace(llama_state=np.asarray(self.memory, dtype="<i4").tobytes(),
                               scores=np.zeros((1, 4), dtype=np.float32), seed=0)

    def load_state(self, saved) -> None:
        self.calls.append("load")
        self.input_ids, self.n_tokens = saved.input_ids.copy(), saved.n_tokens
        if self.refuse_loads:
            self.memory = self.memory[:3]  # llama.cpp may have cleared part of it before it gave up
            raise RuntimeError("Failed to set llama state data")
        self.memory = np.frombuffer(saved.llama_state, dtype="<i4").tolist()


def fake_backend(cache: PrefixStateCache | None, llama: FakeLlama | None = None):
    """A :class:`LlamaCppLLM` on a :class:`FakeLlama`, its chat template one token per character."""
    from longrag.llm.llamacpp import LlamaCppLLM

    llm = LlamaCppLLM.__new__(LlamaCppLLM)  # no model: only the unit-cache path is exercised
    llm.name, llm.model_path, llm._model_sha256, llm._lora = "fake", Path("fake.gguf"), "0" * 64, None
    llm._llama = llama or FakeLlama()
    llm._formatter = object()
    llm.unit_cache, llm.min_cached_prefix_tokens, llm._prefix_key_base = cache, 8, None
    llm.chat_prompt_tokens = lambda messages: [ord(c) for m in messages for c in m["content"]] + [0]
    return llm


def test_a_state_llama_cpp_refuses_is_purged_and_the_prefix_evaluated_again(tmp_path):
    """llama-cpp-python sets the context's tokens before ``llama_state_set_data``: a state it refused
    left the context claiming a prefix it did not hold, the error failed the request, and the entry
    stayed to fail every later request for its unit."""
    cache = PrefixStateCache(ram_bytes=1 << 20, disk_bytes=1 << 20, disk_dir=tmp_path)
    llm = fake_backend(cache)
    fake = llm._llama
    head = "Documents: the top unit"
    messages = [{"role": "user", "content": head + " and the question?"}]
    assert llm._use_prefix(messages, head) == "miss"
    prefix = [ord(c) for c in head]
    fake.reset()  # another request ran in between
    fake.refuse_loads, fake.calls = True, []
    assert llm._use_prefix(messages, head) == "miss"  # evaluated again, as on a miss
    assert fake.calls == ["load", "reset", "clear", "reset", "eval"]
    assert fake._input_ids.tolist() == prefix and fake.memory == prefix  # the context holds what it claims
    assert cache.stats.discarded == 1 and cache.stats.puts == 2  # the refused entry out, a fresh one in
    fake.reset()
    fake.refuse_loads = False
    assert llm._use_prefix(messages, head) == "ram" and fake.memory == prefix
    cache.clear()
    fake.reset()
    assert llm._use_prefix(messages, head) == "disk" and fake.memory == prefix  # the fresh file


def test_the_key_covers_what_shapes_a_state():
    """A disk tier outlives the process and is shared by the node's replicas: a state of another
    llama-cpp-python, window, batch size, KV type or attention kernel must not be found under the
    key of this one (its bytes differ, or llama.cpp refuses them)."""
    import llama_cpp

    from longrag.llm.prefix import prefix_key_base, state_params

    def base(version: str = "0.3.36", **params: object) -> str:
        fake = FakeLlama(**{k: v for k, v in params.items() if k != "n_ctx"}, n_ctx=int(params.get("n_ctx", 256)))
        return prefix_key_base(model_sha256="0" * 64, lora="-", chat_format="chatml", binding_version=version,
                               state_params=state_params(fake))

    changes = {"n_ctx": 512, "n_batch": 32, "n_ubatch": 32, "type_k": 8, "type_v": 8, "flash_attn_type": 0,
               "swa_full": False, "n_seq_max": 2, "kv_unified": True}
    bases = [base(), base(version="0.3.37"), *(base(**{k: v}) for k, v in changes.items())]
    assert len(set(bases)) == len(bases) and base() == base()
    # the binding names these fields: a rename would drop them from the key without a word
    real = state_params(SimpleNamespace(context_params=llama_cpp.llama_context_default_params(), n_ctx=lambda: 8))
    assert {"n_ctx", "n_batch", "n_ubatch", "type_k", "type_v"} <= real.keys()
    assert {"flash_attn", "flash_attn_type"} & real.keys()
    # and the backend's own key follows them
    key = fake_backend(None)._prefix_key(np.arange(40, dtype=np.int32))
    assert fake_backend(None, FakeLlama(n_ctx=512))._prefix_key(np.arange(40, dtype=np.int32)) != key
    assert fake_backend(None, FakeLlama(type_k=8))._prefix_key(np.arange(40, dtype=np.int32)) != key
    assert fake_backend(None)._prefix_key(np.arange(40, dtype=np.int32)) == key


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
