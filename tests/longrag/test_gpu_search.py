"""The GPU search path on a CUDA machine (``pytest -m gpu``; deselected by default): a MaxP shard
moved to a GPU (faiss-gpu where installed, else torch's exact search) returns the same exact results as on the CPU, and its query rate at
batch 1 and 64 is printed next to the CPU's (docs/benchmarks.md, "GPU search", has the H200 run)."""

from __future__ import annotations

import json
import time

import faiss
import numpy as np
import pytest

from lab.synthetic.vectors import clustered_vectors
from longrag.index.maxp import IndexDeviceError, MaxPIndex, check_gpu

pytestmark = pytest.mark.gpu

N, DIM, K = 200_000, 384, 10


def _qps(index: MaxPIndex, queries: np.ndarray, batch: int, seconds: float = 3.0) -> float:
    index.search(queries[:batch], K)  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        lo = (done % (len(queries) // batch)) * batch
        index.search(queries[lo:lo + batch], K)
        done += batch
    return done / (time.perf_counter() - t0)


def test_gpu_matches_cpu_and_reports_queries_per_second():
    try:
        check_gpu(0)
    except IndexDeviceError:
        pytest.skip("needs a CUDA GPU (torch's, or faiss-gpu's)")
    vectors, chunk_ids, unit_ids, queries = clustered_vectors(N, DIM, n_queries=512, seed=0)
    cpu = MaxPIndex.build(vectors, chunk_ids, unit_ids)
    gpu = MaxPIndex.build(vectors, chunk_ids, unit_ids)
    gpu.to_gpu(0)
    assert gpu.device == "cuda"
    want, got = cpu.search(queries, K), gpu.search(queries, K)
    for w, g in zip(want, got):
        assert [h.unit_id for h in g] == [h.unit_id for h in w]
        np.testing.assert_allclose([h.score for h in g], [h.score for h in w], rtol=1e-4, atol=1e-4)
    faiss.omp_set_num_threads(1)
    figures = {f"{dev}_qps_batch{b}": round(_qps(ix, queries, b), 1)
               for dev, ix in (("cpu_1thread", cpu), ("gpu", gpu)) for b in (1, 64)}
    print(json.dumps({"vectors": N, "dim": DIM, "k": K, **figures}))
