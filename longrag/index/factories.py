"""FAISS factory strings of the capacity benchmark: a factory list spelled with ``{nlist}`` split
into factories, the search-time settings swept per factory family, which factories scan every
vector, and why FAISS rejects a factory at a dimension.
"""

from __future__ import annotations

import re

import faiss
import numpy as np

SEARCH_SWEEP = {"IVF": ["nprobe=1", "nprobe=8", "nprobe=32"], "HNSW": ["efSearch=16", "efSearch=64", "efSearch=256"]}
"""Search-time settings measured per approximate factory family (recall vs latency)."""
REFINE_SWEEP = ["nprobe=8,k_factor_rf=1", "nprobe=8,k_factor_rf=4", "nprobe=32,k_factor_rf=4",
                "nprobe=32,k_factor_rf=16"]
"""Settings of a factory with exact re-ranking (``RFlat`` / ``Refine(...)``): probes, and how many
candidates per wanted result the compressed index hands to the re-ranking stage."""


def default_nlist(n_vectors: int) -> int:
    """IVF lists for ``n_vectors``: 4 sqrt(n), at least 16 (FAISS's guideline is 4-16 sqrt(n))."""
    return max(16, int(4 * np.sqrt(n_vectors)))


def split_factories(spec: str, nlist: int) -> list[str]:
    """``"Flat,IVF{nlist},Flat,HNSW32"`` -> ``["Flat", "IVF1024,Flat", "HNSW32"]`` (IVF takes the
    next comma-separated part as its encoding)."""
    parts = [p.strip() for p in spec.format(nlist=nlist).split(",") if p.strip()]
    out: list[str] = []
    i = 0
    while i < len(parts):
        if parts[i].startswith("IVF") and i + 1 < len(parts):
            out.append(f"{parts[i]},{parts[i + 1]}")
            i += 2
        else:
            out.append(parts[i])
            i += 1
        if i < len(parts) and parts[i].startswith(("RFlat", "Refine(")):  # a re-ranking stage belongs to it
            out[-1] += f",{parts[i]}"
            i += 1
    return out


def refined(factory: str) -> bool:
    """Whether ``factory`` re-ranks its candidates with stored vectors (``RFlat``, ``Refine(...)``)."""
    return factory.rsplit(",", 1)[-1].startswith(("RFlat", "Refine("))


def sweep_for(factory: str) -> list[str]:
    if refined(factory):
        return REFINE_SWEEP if factory.startswith("IVF") else ["k_factor_rf=1", "k_factor_rf=4", "k_factor_rf=16"]
    for prefix, params in SEARCH_SWEEP.items():
        if factory.startswith(prefix):
            return params
    return [""]


def exhaustive(factory: str) -> bool:
    """Flat / SQ / PQ scan every vector (latency grows with the shard); IVF and HNSW do not."""
    return not factory.startswith(("IVF", "HNSW"))


def factory_problem(factory: str, dim: int) -> str | None:
    """Why FAISS cannot build ``factory`` at ``dim`` dimensions (its C++ message), or None."""
    try:
        faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except Exception as exc:  # faiss raises RuntimeError with its C++ message
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        return re.sub(r"^Error in .*? at \S+:\d+: ", "", first)  # drop the C++ location
    return None
