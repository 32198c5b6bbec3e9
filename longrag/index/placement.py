"""What one shard actor asks of the cluster: CPUs, the index nodes' custom resource, memory from
the shard's measured size, and a GPU for ``index.device=cuda``.

The cluster definitions (``cluster/aws.yaml``'s ``index_cpu`` node type, the KubeRay ``index-cpu``
worker groups) give their memory-heavy index nodes a custom resource ``index``; a shard actor that
asks for it (``index.node_resource: index``) is placed only there, and its ``memory`` ask (Ray's
``memory`` resource, in bytes) lets the scheduler and the autoscaler bin-pack shards by the memory
they hold rather than by CPU fractions. The memory ask is an estimate from the manifest's file
sizes (:func:`shard_memory_bytes`) times ``index.shard_memory_factor``.

No Ray here: :func:`shard_actor_resources` returns plain ``.options()`` keywords.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from longrag.index.lexical import LEXICAL_PREFIX
from longrag.index.maxp import INDEX_FILES

if TYPE_CHECKING:
    from longrag.config import IndexConfig
    from longrag.index.manifest import ShardEntry

#: A shard actor's resident memory before its shard (Python, numpy, FAISS, pyarrow, the Ray worker):
#: the fitted base of the shard memory model (docs/benchmarks.md) is ~218 MiB.
BASE_BYTES = 256 * 2**20
#: Loaded unit and chunk records take this many times their zstd parquet size in memory (text
#: compresses ~3x, Arrow buffers and id maps add the rest; docs/benchmarks.md's fit: ~1.9 KB per 1 KB chunk).
TEXT_EXPANSION = 4.0


@dataclass(frozen=True)
class ShardPlacement:
    """The placement settings of a build's shard actors (from :class:`longrag.config.IndexConfig`)."""

    num_cpus: float = 0.25
    node_resource: str | None = None
    memory_factor: float = 0.0
    device: str = "cpu"
    num_gpus: float = 1.0

    @classmethod
    def of(cls, config: IndexConfig) -> ShardPlacement:
        return cls(num_cpus=config.shard_num_cpus, node_resource=config.node_resource,
                   memory_factor=config.shard_memory_factor, device=config.device, num_gpus=config.shard_num_gpus)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shard_memory_bytes(entry: ShardEntry) -> int:
    """Estimated resident bytes of one loaded shard: the FAISS index, its maps and the BM25 arrays
    as stored (their in-memory size), the unit and chunk records at :data:`TEXT_EXPANSION` times
    their parquet size, plus the process base :data:`BASE_BYTES`."""
    as_stored = [name for name in entry.files if name in INDEX_FILES or name.startswith(LEXICAL_PREFIX)]
    index = sum(entry.files[name].bytes for name in as_stored)
    records = sum(f.bytes for name, f in entry.files.items() if name not in as_stored)
    return int(BASE_BYTES + index + TEXT_EXPANSION * records)


def shard_actor_resources(placement: ShardPlacement, entry: ShardEntry) -> dict[str, Any]:
    """Ray ``.options()`` keywords for the actor of ``entry``: ``num_cpus``, ``num_gpus`` (cuda),
    ``resources`` ({node_resource: 1}) and ``memory`` (bytes, when ``memory_factor`` > 0)."""
    if placement.device not in ("cpu", "cuda"):
        raise ValueError(f"index.device must be 'cpu' or 'cuda', got {placement.device!r}")
    opts: dict[str, Any] = {"num_cpus": float(placement.num_cpus)}
    if placement.device == "cuda":
        opts["num_gpus"] = float(placement.num_gpus)
    if placement.node_resource:
        opts["resources"] = {placement.node_resource: 1.0}
    if placement.memory_factor > 0:
        opts["memory"] = int(placement.memory_factor * shard_memory_bytes(entry))
    return opts


def describe_ask(opts: dict[str, Any]) -> dict[str, float]:
    """One actor's ask as a flat ``{resource: amount}`` (memory in GiB), for error messages."""
    out: dict[str, float] = {"CPU": float(opts.get("num_cpus", 0))}
    if opts.get("num_gpus"):
        out["GPU"] = float(opts["num_gpus"])
    out.update({k: float(v) for k, v in (opts.get("resources") or {}).items()})
    if opts.get("memory"):
        out["memory_gib"] = round(opts["memory"] / 2**30, 3)
    return out
