"""Exact (brute-force) vector search with PyTorch: the GPU path of ``index.device=cuda`` for exact
(``Flat``) shards when FAISS has no GPU support.

Why: the GPU set (``pip install '.[gpu]'``) is ``ray[llm]`` at the project's Ray, whose vLLM pin
brings a torch built on CUDA 13, and no FAISS GPU wheel on PyPI is built for CUDA 13 (``faiss-gpu``
and ``faiss-gpu-cu12`` need the CUDA 12 runtime; issue 31). An exact inner-product search is one
matrix product and a top-k, which torch does on the GPU at memory bandwidth, so a Flat shard needs
nothing more. Approximate factories (IVF, PQ, HNSW) stay FAISS's: on the CPU, or on a GPU with a
FAISS-GPU build of the node image.

:class:`TorchFlatIndex` answers ``search(x, k) -> (scores, ids)`` exactly as FAISS ``IndexFlatIP``
(``IndexFlatL2``) does: float32 ``(nq, k)`` scores best first (inner products descending, squared L2
distances ascending), int64 ids, ``-1`` ids past ``ntotal``; with ``ntotal``, ``d`` and
``metric_type``, so :class:`longrag.index.maxp.MaxPIndex` holds it in place of the FAISS index.
``dtype="float16"`` halves the memory (and the time: the search reads every vector once) at the
price of approximate scores; the default ``float32`` ranks as FAISS does, up to float rounding.

torch is imported on first use, not with this module (``maxp`` imports it on every node).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: FAISS's metric constants (``faiss.METRIC_INNER_PRODUCT``, ``faiss.METRIC_L2``), without importing FAISS.
METRIC_INNER_PRODUCT, METRIC_L2 = 0, 1

#: Bytes of one block of the (queries x vectors) score matrix: queries are searched in blocks this big.
SCORE_BLOCK_BYTES = 1 << 30


def cuda_devices() -> int:
    """GPUs torch sees (0 without CUDA or without torch's CUDA build)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def can_search(index: Any) -> bool:
    """Whether ``index`` (a FAISS index) is exact flat storage this module can search: ``IndexFlat``
    (``IndexFlatIP``, ``IndexFlatL2``) with inner product or L2."""
    import faiss

    concrete = faiss.downcast_index(index)
    return isinstance(concrete, faiss.IndexFlat) and concrete.metric_type in (METRIC_INNER_PRODUCT, METRIC_L2)


class TorchFlatIndex:
    """Vectors held as one torch matrix on ``device``; :meth:`search` is FAISS ``IndexFlat``'s."""

    def __init__(self, vectors: np.ndarray, metric_type: int = METRIC_INNER_PRODUCT, device: str = "cuda",
                 dtype: str = "float32") -> None:
        import torch

        if metric_type not in (METRIC_INNER_PRODUCT, METRIC_L2):
            raise ValueError(f"metric_type must be {METRIC_INNER_PRODUCT} (inner product) or {METRIC_L2} (L2)")
        if dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2:
            raise ValueError(f"vectors must be 2-D (n, d), got shape {vectors.shape}")
        self.metric_type = metric_type
        self.d = int(vectors.shape[1])
        self.ntotal = int(vectors.shape[0])
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.xb = torch.from_numpy(vectors).to(self.device, self.dtype)
        # ||y||^2 of every stored vector, for L2: ||x - y||^2 = ||x||^2 + ||y||^2 - 2 x.y
        self.norms = (self.xb.float() ** 2).sum(1) if metric_type == METRIC_L2 else None

    @classmethod
    def from_faiss(cls, index: Any, device: str = "cuda", dtype: str = "float32") -> TorchFlatIndex:
        """The vectors of a FAISS ``IndexFlat`` copied to ``device``."""
        import faiss

        if not can_search(index):
            raise ValueError(f"{type(index).__name__} is not exact flat storage (IndexFlatIP / IndexFlatL2)")
        flat = faiss.downcast_index(index)
        return cls(flat.reconstruct_n(0, flat.ntotal), int(flat.metric_type), device, dtype)

    @property
    def nbytes(self) -> int:
        """Bytes the vectors take on the device."""
        return self.xb.element_size() * self.xb.nelement()

    def search(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest stored vectors of each row of ``x`` (float32 (nq, d)): ``(scores float32
        (nq, k), ids int64 (nq, k))``, best first; past ``ntotal``, ids -1 and scores -inf (inner
        product) or +inf (L2)."""
        import torch

        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ValueError(f"queries must be (n, {self.d}), got shape {x.shape}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        nq, ip = x.shape[0], self.metric_type == METRIC_INNER_PRODUCT
        scores = np.full((nq, k), -np.inf if ip else np.inf, dtype=np.float32)
        ids = np.full((nq, k), -1, dtype=np.int64)
        kk = min(k, self.ntotal)
        if nq == 0 or kk == 0:
            return scores, ids
        block = max(1, SCORE_BLOCK_BYTES // (4 * self.ntotal))
        with torch.inference_mode():
            for lo in range(0, nq, block):
                q = torch.from_numpy(x[lo:lo + block]).to(self.device)
                sim = q.to(self.dtype) @ self.xb.T
                if ip:  # top-k in the stored dtype: the cast to float32 is monotone, so the same ranking
                    top, idx = torch.topk(sim, kk, dim=1, largest=True, sorted=True)
                else:
                    dist = (q * q).sum(1, keepdim=True) + self.norms[None, :] - 2 * sim.float()
                    top, idx = torch.topk(dist.clamp_min_(0), kk, dim=1, largest=False, sorted=True)
                scores[lo:lo + len(q), :kk] = top.float().cpu().numpy()
                ids[lo:lo + len(q), :kk] = idx.cpu().numpy()
        return scores, ids

    def __repr__(self) -> str:
        return f"TorchFlatIndex(ntotal={self.ntotal}, d={self.d}, metric_type={self.metric_type}, " \
               f"device={str(self.device)!r}, dtype={str(self.dtype).removeprefix('torch.')!r})"
