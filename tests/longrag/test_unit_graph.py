"""The unit link graph (longrag.index.graph): contraction of document links onto units, its
parquet round trip, and the graph expansion's walk, checked against networkx (an independent
PageRank) and brute-force contraction."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from longrag.index.graph import (
    GraphExpansion,
    UnitGraph,
    expand,
    split_mode,
    unit_graph_from_documents,
    unit_graph_from_labels,
)
from longrag.types import Document, Unit, UnitHit


def _edges(g: UnitGraph) -> set[tuple[str, str]]:
    return {(g.unit_ids[i], g.unit_ids[j]) for i in range(g.n_units) for j in g.neighbours(i).tolist()}


def test_contraction_matches_brute_force():
    rng = np.random.default_rng(0)
    n_docs, n_units = 60, 17
    unit_of_doc = rng.integers(0, n_units, n_docs)
    unit_of_doc[5] = -1  # a document in no unit: its links are dropped
    src, dst = rng.integers(0, n_docs, 150), rng.integers(0, n_docs, 150)
    ids = [f"u{i:02d}" for i in range(n_units)]
    g = unit_graph_from_labels(ids, np.arange(n_units) % 3, unit_of_doc, src, dst)
    want = set()
    for a, b in zip(src.tolist(), dst.tolist()):
        ua, ub = int(unit_of_doc[a]), int(unit_of_doc[b])
        if ua >= 0 and ub >= 0 and ua != ub:
            want |= {(ids[ua], ids[ub]), (ids[ub], ids[ua])}
    assert _edges(g) == want
    assert g.n_links == len(want) // 2
    assert g.shards.tolist() == [i % 3 for i in range(n_units)]


def test_from_documents_links_units_of_linked_documents():
    docs = [Document(doc_id="a", title="A", text="x", links=["B"]), Document(doc_id="b", title="B", text="y"),
            Document(doc_id="c", title="C", text="z", links=["A", "Nowhere"]), Document(doc_id="d", title="D", text="w")]
    units = [Unit(unit_id="g0", doc_ids=["a", "b"], titles=["A", "B"], text="", n_tokens=1),
             Unit(unit_id="g1", doc_ids=["c"], titles=["C"], text="", n_tokens=1),
             Unit(unit_id="g2", doc_ids=["d"], titles=["D"], text="", n_tokens=1)]
    g = unit_graph_from_documents(docs, units, [0, 1, 1])
    assert _edges(g) == {("g0", "g1"), ("g1", "g0")}  # a-b is inside g0; "Nowhere" is not in the corpus
    assert g.neighbours(g.position["g2"]).size == 0


def test_parquet_round_trip():
    rng = np.random.default_rng(1)
    ids = [f"unit-{i}" for i in range(40)]
    g = unit_graph_from_labels(ids, rng.integers(0, 4, 40), np.arange(40), rng.integers(0, 40, 90),
                               rng.integers(0, 40, 90))
    back = UnitGraph.from_parquet(g.to_parquet())
    assert back.unit_ids == g.unit_ids
    assert back.shards.tolist() == g.shards.tolist()
    assert back.indptr.tolist() == g.indptr.tolist() and back.indices.tolist() == g.indices.tolist()
    empty = UnitGraph.from_parquet(unit_graph_from_labels([], [], np.zeros(0), np.zeros(0), np.zeros(0)).to_parquet())
    assert empty.n_units == 0 and empty.n_links == 0



def test_nbytes_counts_the_lookup_and_the_csr_once_built():
    rng = np.random.default_rng(2)
    n = 1_000
    g = unit_graph_from_labels([f"unit-{i:05d}" for i in range(n)], np.zeros(n), np.arange(n),
                               rng.integers(0, n, 3_000), rng.integers(0, n, 3_000))
    arrays = g.shards.nbytes + g.indptr.nbytes + g.indices.nbytes
    bare = g.nbytes()
    assert bare >= arrays + n * (49 + 10)  # a compact ASCII string object is 49 bytes + its characters
    _ = g.position
    with_lookup = g.nbytes()
    assert with_lookup - bare >= 8 * n  # a dict slot per unit at least
    _ = g.matrix
    # the CSR shares the neighbour array: only its one-byte data and its own row bounds are new
    added = g.nbytes() - with_lookup
    assert g.matrix.data.nbytes == 2 * g.n_links and added <= g.matrix.data.nbytes + g.indptr.nbytes

def _ring_graph(n: int, chords: list[tuple[int, int]]) -> tuple[UnitGraph, nx.Graph]:
    pairs = [(i, (i + 1) % n) for i in range(n)] + chords
    ids = [f"u{i:02d}" for i in range(n)]
    g = unit_graph_from_labels(ids, np.zeros(n), np.arange(n), np.array([a for a, _ in pairs]),
                               np.array([b for _, b in pairs]))
    ref = nx.Graph()
    ref.add_nodes_from(ids)
    ref.add_edges_from((ids[a], ids[b]) for a, b in pairs)
    return g, ref


def test_walk_equals_networkx_personalized_pagerank():
    """With a radius covering the graph, the walk is the whole graph's PPR: the blended scores of
    expand() recomputed from networkx's PageRank give the same ranking and values."""
    g, ref = _ring_graph(12, [(0, 6), (3, 9), (2, 7)])
    scores = [0.9, 0.8, 0.75, 0.4, 0.3, 0.2]
    hits = [UnitHit(unit_id=f"u{i:02d}", score=s, best_chunk_id=f"u{i:02d}:0", shard=0)
            for i, s in zip([1, 4, 10, 0, 5, 8], scores)]
    settings = GraphExpansion(seeds=3, alpha=0.3, blend=0.6, radius=12, max_nodes=100, temperature=5.0)
    got = expand(hits, g, 12, settings)
    z = (np.array(scores) - min(scores)) / (max(scores) - min(scores))
    restart = {h.unit_id: float(np.exp(5.0 * (zi - 1.0))) for h, zi in zip(hits[:3], z[:3])}
    total = sum(restart.values())
    # networkx: with probability `alpha` (its damping) follow a link, else restart; ours: restart with alpha
    ppr = nx.pagerank(ref, alpha=1 - settings.alpha, personalization={u: restart.get(u, 0.0) / total for u in ref},
                      tol=1e-12, max_iter=1000)
    top = max(ppr.values())
    want = {u: settings.blend * ppr[u] / top for u in ref}
    for h, zi in zip(hits, z):
        want[h.unit_id] += (1 - settings.blend) * zi
    expected = sorted(want, key=lambda u: -want[u])
    assert [h.unit_id for h in got] == expected
    assert [h.score for h in got] == pytest.approx([want[u] for u in expected], abs=1e-4)
    by_id = {h.unit_id: h for h in got}
    assert by_id["u02"].found_by == "graph" and by_id["u02"].best_chunk_id == ""  # only the walk reached it
    assert by_id["u01"].found_by == "dense" and by_id["u01"].best_chunk_id == "u01:0"


def test_walk_reaches_only_the_seeds_neighbourhood():
    g, _ = _ring_graph(30, [])
    hits = [UnitHit(unit_id="u10", score=1.0, best_chunk_id="c", shard=0)]
    got = expand(hits, g, 30, GraphExpansion(seeds=1, radius=2))
    assert {h.unit_id for h in got} == {"u08", "u09", "u10", "u11", "u12"}
    assert got[0].unit_id == "u10"
    assert len(expand(hits, g, 30, GraphExpansion(seeds=1, radius=2, max_nodes=3))) == 3


def test_unlinked_and_unknown_units_keep_the_first_stage_order():
    g, _ = _ring_graph(5, [])
    hits = [UnitHit(unit_id="zz-not-in-graph", score=0.9, best_chunk_id="a", shard=1, found_by="bm25"),
            UnitHit(unit_id="u01", score=0.5, best_chunk_id="b", shard=0)]
    assert [h.unit_id for h in expand(hits, g, 1, GraphExpansion(blend=0.0))] == ["zz-not-in-graph"]
    out = expand(hits, g, 5, GraphExpansion())
    assert out[0].found_by == "bm25"
    assert {h.unit_id for h in out} >= {"zz-not-in-graph", "u01", "u00", "u02"}
    assert expand([], g, 3) == []
    with pytest.raises(ValueError):
        expand(hits, g, 0)


@pytest.mark.parametrize("mode,want", [("dense", (False, False)), ("hybrid", (True, False)), ("graph", (False, True)),
                                       ("hybrid+graph", (True, True))])
def test_split_mode(mode, want):
    assert split_mode(mode) == want


def test_settings_are_checked():
    for bad in ({"seeds": 0}, {"alpha": 0.0}, {"blend": 1.5}, {"radius": -1}):
        with pytest.raises(ValueError):
            GraphExpansion(**bad)


def test_a_hub_next_to_a_seed_adds_only_what_the_budget_leaves():
    """A seed linked to a hub of 20,000 units: the walk covers at most max_nodes units, the nearest
    first (the seed's own neighbours, the hub among them), and reads at most 4 x max_nodes links a step."""
    n = 20_003
    ids = [f"u{i:05d}" for i in range(n)]
    hub, seed, friend = 0, 1, 2
    src = np.array([seed, seed] + [hub] * (n - 3))
    dst = np.array([hub, friend] + list(range(3, n)))
    g = unit_graph_from_labels(ids, np.zeros(n), np.arange(n), src, dst)
    hits = [UnitHit(unit_id=ids[seed], score=1.0, best_chunk_id="c", shard=0)]
    out = expand(hits, g, 60, GraphExpansion(seeds=1, radius=2, max_nodes=50))
    got = [h.unit_id for h in out]
    assert len(got) == 50 and got[0] == ids[seed] and {ids[hub], ids[friend]} <= set(got)
    assert all(h.found_by == "graph" for h in out[1:])
