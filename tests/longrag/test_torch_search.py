"""The torch exact search (longrag/index/torch_search.py), run on the CPU, against FAISS's own
``IndexFlatIP`` / ``IndexFlatL2`` as the independent reference: the same top-k ids in the same order
and the same scores on random vectors; and ``MaxPIndex.to_gpu`` taking that path when FAISS has no
GPU support (the device made the CPU here), with the same unit hits as the CPU shard."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from lab.synthetic.vectors import clustered_vectors
from longrag.index import torch_search
from longrag.index.maxp import GPU_MAX_K, IndexDeviceError, MaxPIndex, check_gpu
from longrag.index.torch_search import METRIC_INNER_PRODUCT, METRIC_L2, TorchFlatIndex


def _random(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("metric, reference", [(METRIC_INNER_PRODUCT, faiss.IndexFlatIP), (METRIC_L2, faiss.IndexFlatL2)])
def test_same_top_k_as_faiss_flat(metric, reference):
    xb, xq = _random(20_000, 64, 0), _random(200, 64, 1)
    ref = reference(64)
    ref.add(xb)
    want_d, want_i = ref.search(xq, 50)
    got_d, got_i = TorchFlatIndex(xb, metric, device="cpu").search(xq, 50)
    assert got_i.dtype == np.int64 and got_d.dtype == np.float32 and got_i.shape == (200, 50)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_d, want_d, rtol=1e-4, atol=1e-4)


def test_from_faiss_blocks_and_padding_past_ntotal(monkeypatch):
    xb, xq = _random(300, 16, 2), _random(37, 16, 3)
    ref = faiss.IndexFlatIP(16)
    ref.add(xb)
    monkeypatch.setattr(torch_search, "SCORE_BLOCK_BYTES", 4 * 300 * 5)  # 5 queries a block: 8 blocks
    index = TorchFlatIndex.from_faiss(ref, device="cpu")
    assert (index.ntotal, index.d, index.metric_type, index.nbytes) == (300, 16, METRIC_INNER_PRODUCT, 300 * 16 * 4)
    want_d, want_i = ref.search(xq, 310)  # 10 more than it holds: FAISS pads with -1
    got_d, got_i = index.search(xq, 310)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_d[:, :300], want_d[:, :300], rtol=1e-5, atol=1e-5)
    assert np.isneginf(got_d[:, 300:]).all()
    assert index.search(xq[:0], 3)[1].shape == (0, 3)


def test_half_precision_is_close_not_exact():
    xb, xq = _random(5_000, 64, 4), _random(50, 64, 5)
    exact = TorchFlatIndex(xb, device="cpu").search(xq, 10)[1]
    half = TorchFlatIndex(xb, device="cpu", dtype="bfloat16").search(xq, 10)[1]
    assert np.mean(half[:, 0] == exact[:, 0]) >= 0.9  # bfloat16's 8 bits of mantissa reorder near ties


def test_only_flat_storage_is_searched():
    assert torch_search.can_search(faiss.index_factory(8, "Flat", faiss.METRIC_INNER_PRODUCT))
    ivf = faiss.index_factory(8, "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    assert not torch_search.can_search(ivf)
    with pytest.raises(ValueError, match="not exact flat storage"):
        TorchFlatIndex.from_faiss(ivf, device="cpu")
    with pytest.raises(ValueError, match="dtype"):
        TorchFlatIndex(_random(4, 8, 0), device="cpu", dtype="int8")


@pytest.fixture
def torch_gpu_on_cpu(monkeypatch):
    """This machine as a one-GPU node without FAISS GPU support: torch "sees" GPU 0, whose
    TorchFlatIndex lives on the CPU."""
    assert not hasattr(faiss, "StandardGpuResources"), "this FAISS has GPU support: the torch path is not taken"
    monkeypatch.setattr(torch_search, "cuda_devices", lambda: 1)
    real = TorchFlatIndex.from_faiss.__func__
    monkeypatch.setattr(TorchFlatIndex, "from_faiss",
                        classmethod(lambda cls, index, device="cuda", dtype="float32": real(cls, index, "cpu", dtype)))


def test_maxp_to_gpu_searches_through_torch_with_the_same_hits(torch_gpu_on_cpu):
    vectors, chunk_ids, unit_ids, queries = clustered_vectors(6_000, 32, chunks_per_unit=600, n_queries=40, seed=1)
    cpu = MaxPIndex.build(vectors, chunk_ids, unit_ids)
    gpu = MaxPIndex.build(vectors, chunk_ids, unit_ids)
    check_gpu(0)
    gpu.to_gpu(0)
    assert gpu.device == "cuda" and isinstance(gpu.index, TorchFlatIndex)
    assert (gpu.ntotal, gpu.dim) == (cpu.ntotal, cpu.dim)
    want, want_k = cpu.search_with_stats(queries, 8)
    got, got_k = gpu.search_with_stats(queries, 8)
    assert want_k.max() > GPU_MAX_K  # 600 chunks a unit: searches wider than FAISS GPU's limit, still on torch
    np.testing.assert_array_equal(got_k, want_k)
    for w, g in zip(want, got):
        assert [(h.unit_id, h.best_chunk_id) for h in g] == [(h.unit_id, h.best_chunk_id) for h in w]
        np.testing.assert_allclose([h.score for h in g], [h.score for h in w], rtol=1e-5, atol=1e-5)
    gpu.set_search_params("")
    assert gpu.to_files()["index.faiss"] == cpu.to_files()["index.faiss"]  # saved from the CPU copy


def test_maxp_to_gpu_refuses_an_approximate_index_without_faiss_gpu(torch_gpu_on_cpu):
    vectors, chunk_ids, unit_ids, _ = clustered_vectors(2_000, 16, n_queries=0, seed=2)
    ivf = MaxPIndex.build(vectors, chunk_ids, unit_ids, factory="IVF8,Flat")
    with pytest.raises(IndexDeviceError, match="IVF/PQ"):
        ivf.to_gpu(0)
    assert ivf.device == "cpu"


def test_no_gpu_anywhere_is_a_config_error():
    if torch_search.cuda_devices():
        pytest.skip("torch sees a GPU")
    with pytest.raises(IndexDeviceError, match=r"torch sees 0 GPU\(s\).*index.device=cpu"):
        check_gpu(0)
