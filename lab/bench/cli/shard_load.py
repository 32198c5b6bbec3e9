"""``python -m jobs.bench shard-load``: how long a shard replica takes to load a large shard, and what it
holds in memory, read as bytes (every file read, hashed, then deserialized: what each replica start did)
against the node-local shard cache (:mod:`longrag.index.shard_cache`: hashed once per content, the FAISS
index memory-mapped). Issue 40, item 6.

Writes a synthetic shard of ``--vectors`` chunk vectors (``--dim``, exact Flat index, ``--chunks-per-unit``)
to a local store under ``--out``, then loads it with :func:`longrag.index.artifacts.load_shard` in a fresh
process per setting (so each peak RSS is its own): ``bytes`` (the old path), ``cache, first load`` (a new
cache: hashed once, stamped) and ``cache, warm`` (the stamp found: no hash). Per setting: load seconds, peak
RSS, the first search and the p50 of ``--searches`` more (k = 10; a mapped index pays its page faults on
first touch). Prints a table and one JSON line; the figures are one run's, with the load average.

``--build``: instead, one shard's build task (:func:`actors.build.build_from_staging`, Ray-free here) over
``--vectors`` synthetic staged chunks of ``--text-bytes`` each, in a fresh process: its peak RSS against
what :func:`longrag.index.capacity.shard_build_bytes` declares for it (Ray's ``memory=``).

    python -m jobs.bench shard-load --vectors 1000000 --dim 384 --out artifacts/bench-shard-load
    python -m jobs.bench shard-load --build --vectors 200000 --dim 384 --out artifacts/bench-shard-build
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SETTINGS = ("bytes", "cache, first load", "cache, warm")


def write_shard_files(out: Path, n: int, dim: int, per_unit: int) -> str:
    """A complete one-shard build of random unit vectors (index and units only: what load_shard reads)."""
    from longrag.config import LongRAGConfig
    from longrag.index.artifacts import UNITS_FILE, ArtifactStore
    from longrag.index.manifest import FileEntry, Manifest, ShardEntry
    from longrag.index.maxp import MaxPIndex
    from longrag.records import units_to_parquet
    from longrag.store import sha256_bytes
    from longrag.types import Unit

    store = ArtifactStore.open(str(out))
    if store.has_manifest() and store.read_manifest().shards[0].n_chunks == n:
        return str(out)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((n, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    n_units = (n + per_unit - 1) // per_unit
    unit_ids = [f"u{i:08d}" for i in range(n_units)]
    chunk_units = [unit_ids[i // per_unit] for i in range(n)]
    chunk_ids = [f"{chunk_units[i]}:{i % per_unit:04d}" for i in range(n)]
    index = MaxPIndex.build(vectors, chunk_ids, chunk_units)
    del vectors
    units = [Unit(unit_id=u, doc_ids=[u], titles=[u], text=f"unit {u}", n_tokens=2) for u in unit_ids]
    manifest = Manifest.create(LongRAGConfig(), dim=dim, documents=n_units)
    files = {UNITS_FILE: units_to_parquet(units), **index.to_files()}
    entries = {}
    for name, data in files.items():
        store.storage.write_bytes(store.shard_key(0, name), data)
        entries[name] = FileEntry(sha256=sha256_bytes(data), bytes=len(data))
    manifest.add_shard(ShardEntry(shard_id=0, n_units=n_units, n_chunks=n, files=entries))
    manifest.mark_complete()
    store.write_manifest(manifest)
    return str(out)


def measure(uri: str, setting: str, cache_dir: str, searches: int) -> dict:
    """One load in this process (called in a child): seconds, peak RSS, first and p50 search ms."""
    from longrag.index.artifacts import ArtifactStore, load_shard
    from longrag.index.shard_cache import ShardFileCache
    from longrag.memory import MemorySampler  # sampled: ru_maxrss would carry the parent's peak across exec

    store = ArtifactStore.open(uri)
    cache = None if setting == "bytes" else ShardFileCache(cache_dir)
    with MemorySampler(0.05) as mem:
        t0 = time.perf_counter()
        index, units = load_shard(store, 0, cache=cache)
        load_s = time.perf_counter() - t0
        load_peak = mem.new_phase()
        rng = np.random.default_rng(1)
        queries = rng.standard_normal((searches + 1, index.dim), dtype=np.float32)
        times = []
        for q in queries:
            t1 = time.perf_counter()
            index.search(q[None, :], 10)
            times.append((time.perf_counter() - t1) * 1e3)
    return {"setting": setting, "load_s": round(load_s, 3), "start_rss_mb": round(mem.base_mb, 1),
            "peak_rss_mb": round(max(load_peak, mem.peak_bytes) / 2**20, 1),
            "rss_after_searches_mb": round(mem.sample() / 2**20, 1),
            # what is this process' own (a mapped index's pages are the page cache's, shared by the node's replicas)
            "private_after_searches_mb": round(__import__("psutil").Process().memory_full_info().uss / 2**20, 1),
            "first_search_ms": round(times[0], 1), "search_p50_ms": round(float(np.median(times[1:])), 1),
            "hashed": getattr(cache, "hashed", None), "cache_hits": getattr(cache, "hits", None),
            "vectors": index.ntotal, "units": len(units)}


def stage_synthetic(out: Path, n: int, dim: int, per_unit: int, text_bytes: int) -> int:
    """Staged units and embedded chunks of one shard, as the build's Ray Data stages leave them."""
    from actors.build import stage_chunks
    from longrag.index.artifacts import ArtifactStore
    from longrag.index.distplan import stage_shard_units
    from longrag.types import Unit

    store = ArtifactStore.open(str(out))
    for key in store.storage.list(""):
        store.storage.delete(key)
    rng = np.random.default_rng(0)
    n_units = (n + per_unit - 1) // per_unit
    stage_shard_units(store.storage, 0, [Unit(unit_id=f"u{i:08d}", doc_ids=[str(i)], titles=[f"T{i}"],
                                              text="x", n_tokens=1) for i in range(n_units)])
    words = np.array([f"w{i}" for i in range(5000)], dtype=object)
    total = 0
    for lo in range(0, n, 50_000):
        rows = range(lo, min(n, lo + 50_000))
        vectors = rng.standard_normal((len(rows), dim), dtype=np.float32)
        texts = [" ".join(rng.choice(words, text_bytes // 6)) for _ in rows]
        total += sum(len(t.encode()) for t in texts)
        stage_chunks({"chunk_id": np.array([f"u{i // per_unit:08d}:{i % per_unit:04d}" for i in rows], dtype=object),
                      "unit_id": np.array([f"u{i // per_unit:08d}" for i in rows], dtype=object),
                      "position": np.array([i % per_unit for i in rows], dtype=np.int64),
                      "text": np.array(texts, dtype=object), "n_tokens": np.full(len(rows), 8, dtype=np.int64),
                      "shard": np.zeros(len(rows), dtype=np.int64), "vector": vectors}, str(out))
    return total


def measure_build(uri: str, n: int, dim: int, text_total: int) -> dict:
    """One shard build in this process (a child): seconds, peak RSS, and the declared memory."""
    from actors.build import _build_from_staging
    from longrag.index.capacity import shard_build_bytes
    from longrag.memory import MemorySampler

    t0 = time.perf_counter()
    with MemorySampler(0.1) as mem:
        _build_from_staging(uri, 0, "Flat", "ip")
    declared = shard_build_bytes(n, dim, text_total)
    return {"chunks": n, "dim": dim, "text_mb": round(text_total / 2**20, 1), "build_s": round(time.perf_counter() - t0, 1),
            "peak_rss_mb": round(mem.peak_mb, 1), "start_rss_mb": round(mem.base_mb, 1),
            "declared_mb": round(declared / 2**20, 1), "peak_over_declared": round(mem.peak_bytes / declared, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobs.bench shard-load", description=__doc__.split("\n\n")[0])
    p.add_argument("--vectors", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--chunks-per-unit", type=int, default=10)
    p.add_argument("--searches", type=int, default=20)
    p.add_argument("--out", default="artifacts/bench-shard-load")
    p.add_argument("--build", action="store_true", help="one shard build's peak RSS against its declared memory")
    p.add_argument("--text-bytes", type=int, default=600, help="--build: bytes of text per chunk")
    p.add_argument("--child", nargs=3, metavar=("URI", "SETTING", "CACHE"), help=argparse.SUPPRESS)
    p.add_argument("--build-child", nargs=2, metavar=("URI", "TEXT_TOTAL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child, args.searches)))
        return 0
    if args.build_child:
        print(json.dumps(measure_build(args.build_child[0], args.vectors, args.dim, int(args.build_child[1]))))
        return 0
    out = Path(args.out)
    if args.build:
        t0 = time.perf_counter()
        text_total = stage_synthetic(out, args.vectors, args.dim, args.chunks_per_unit, args.text_bytes)
        print(f"{args.vectors:,} chunks staged in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        load = os.getloadavg()
        res = subprocess.run([sys.executable, "-m", "jobs.bench", "shard-load", "--vectors", str(args.vectors), "--dim",
                              str(args.dim), "--build-child", str(out), str(text_total)],
                             capture_output=True, text=True, check=True)
        row = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"| chunks | dim | text MB | build s | peak RSS MB | declared MB | peak / declared |\n| --- | --- | --- | "
              f"--- | --- | --- | --- |\n| {row['chunks']:,} | {row['dim']} | {row['text_mb']} | {row['build_s']} | "
              f"{row['peak_rss_mb']} | {row['declared_mb']} | {row['peak_over_declared']} |")
        print(json.dumps({"bench": "shard_build", "loadavg": load, "loadavg_after": os.getloadavg(), **row}))
        return 0
    t0 = time.perf_counter()
    uri = write_shard_files(out / "build", args.vectors, args.dim, args.chunks_per_unit)
    print(f"shard of {args.vectors:,} x {args.dim} written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    cache_dir = out / "cache"
    if cache_dir.exists():
        import shutil

        shutil.rmtree(cache_dir)
    load = os.getloadavg()
    rows = []
    for setting in SETTINGS:
        res = subprocess.run([sys.executable, "-m", "jobs.bench", "shard-load", "--searches", str(args.searches),
                              "--child", uri, setting, str(cache_dir)], capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(f"{setting}: {rows[-1]}", file=sys.stderr)
    base = rows[0]
    print("| setting | load s | x bytes | peak RSS MB | RSS / private after searches MB | first search ms | search p50 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['setting']} | {r['load_s']} | {r['load_s'] / base['load_s']:.2f} | {r['peak_rss_mb']} | "
              f"{r['rss_after_searches_mb']} / {r['private_after_searches_mb']} | {r['first_search_ms']} | "
              f"{r['search_p50_ms']} |")
    print(json.dumps({"bench": "shard_load", "vectors": args.vectors, "dim": args.dim, "loadavg": load,
                      "loadavg_after": os.getloadavg(), "results": rows}))
    return 0
