"""What the ``Retriever`` holds: the index backend, as a :class:`typing.Protocol`.

Three kinds implement it, none a subclass of another: :class:`serve.index_app.ServeIndex` (the
build's Serve application of shard deployments, the default), :class:`actors.inprocess_index.InProcessIndex`
(every shard in the replica's own process, ``serve.colocate``) and the tests' fakes
(``tests.fakes.FakeShardsIndex`` and its subclasses: the real scatter/gather over fake replicas).
Written down here, without Ray, so the three cannot drift apart unseen:
``tests/serve/test_backend_protocol.py`` compares every method's signature with this one's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from actors.sharded_index import ShardedSearchResult
    from longrag.config import IndexConfig
    from longrag.index.fusion import Fusion
    from longrag.index.manifest import Manifest
    from longrag.types import RetrievedUnit, ShardRedundancy, UnitHit

__all__ = ["IndexBackend", "IndexBackendFactory"]


@runtime_checkable
class IndexBackend(Protocol):
    """One build's index, searched by a ``Retriever`` replica; the backend holds its build from
    construction until :meth:`release` (or a while after :meth:`retire`). Its searches are coroutines: a backend that searches in this
    process runs them in a worker thread, so the replica's event loop keeps answering.

    A backend may also have ``released`` (a bool: whether its hold ended), which the Retriever reads
    to forget superseded backends whose retirement is over; one without it is kept until the
    replica stops (releasing twice must then be harmless)."""

    manifest: Manifest
    """The build's manifest (its ``build_id``, shards, embedding)."""

    async def search(self, queries: np.ndarray, k: int, texts: list[str] | None = None,
                     fusion: Fusion | None = None) -> ShardedSearchResult:
        """Exact top-``k`` units per query (``queries``: ``(n, dim)``) over the shards that answer, with
        their coverage; with ``texts`` (one per query) the hybrid search fused by ``fusion``."""
        ...

    async def retrieve_units(self, hits: list[UnitHit], query: np.ndarray | None = None,
                             evidence: bool = True) -> list[RetrievedUnit]:
        """The hits joined with their unit records, in rank order; with the ``query`` vector each
        unit's documents best first (``evidence``) and a best chunk for hits without one."""
        ...

    async def search_units(self, query: np.ndarray, k: int, evidence: bool = False
                           ) -> tuple[ShardedSearchResult, list[RetrievedUnit]]:
        """One question's (``query``: ``(dim,)``) dense top-``k`` with its units: what :meth:`search`
        then :meth:`retrieve_units` give, in fewer calls."""
        ...

    async def liveness(self) -> list[ShardRedundancy]:
        """Each shard's running replicas read again ("1 of 2")."""
        ...

    async def retire(self) -> None:
        """A newer build took over and the replica's requests on this one have ended: end the hold
        ``index.retire_after_s`` later (or at once, where nothing outside the process shares it)."""
        ...

    async def release(self) -> None:
        """The replica goes away: end the hold now (a retirement still waiting ends here too)."""
        ...


@runtime_checkable
class IndexBackendFactory(Protocol):
    """``index_cls`` of the Retriever: builds the backend of the build at ``index_uri`` for the Serve
    app ``app_name``'s replica ``holder`` (whose hold it is, where holds are counted)."""

    def __call__(self, index_uri: str, config: IndexConfig, *, app_name: str, holder: str) -> IndexBackend:
        ...
