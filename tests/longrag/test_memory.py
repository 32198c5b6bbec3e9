"""The memory sampler (``longrag.memory``): the peak of a process tree, and each process's own peak by
name (what the demo reports per phase), checked against a child that holds a known amount."""

from __future__ import annotations

import subprocess
import sys
import time

from longrag.memory import MemorySampler

HOLD_MB = 160


def test_each_process_peak_is_named_and_counted_with_the_tree():
    code = f"import time; x = bytearray({HOLD_MB} * 2**20); x[::4096] = b'1' * len(x[::4096]); time.sleep(30)"
    with MemorySampler(0.05, children=True) as mem:
        child = subprocess.Popen([sys.executable, "-c", code])
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not any(f"[{child.pid}]" in k and v > HOLD_MB * 2**20
                                                          for k, v in mem.by_process.items()):
                time.sleep(0.05)
        finally:
            child.kill()
            child.wait()
    mine = {k: v for k, v in mem.by_process.items() if k.endswith(f"[{child.pid}]")}
    assert len(mine) == 1, mem.by_process
    (name, peak), = mine.items()
    assert name.startswith("python") and peak > HOLD_MB * 2**20
    assert mem.peak_bytes >= peak  # the tree's peak holds the child's
    top = mem.peaks_mb(top=len(mem.by_process))
    assert list(top.values()) == sorted(top.values(), reverse=True) and top[name] > HOLD_MB
    # at the tree's peak the child held its bytes, and the processes then sum to the peak
    at_peak = mem.at_peak_mb(top=100)
    assert at_peak[name] > HOLD_MB and abs(sum(at_peak.values()) - mem.peak_bytes / 2**20) < 1
    # a new phase forgets the last one's processes
    mem.new_phase()
    assert all(f"[{child.pid}]" not in k for k in mem.by_process)
    assert all(f"[{child.pid}]" not in k for k in mem.at_peak_mb(top=100))


def test_without_children_only_this_process_is_sampled():
    with MemorySampler(0.05) as mem:
        time.sleep(0.15)
    assert len(mem.by_process) == 1 and mem.peak_bytes > 0
