"""Incremental updates (longrag.index.update, jobs.update) and build aliases (longrag.index.alias):
an update gives the units (and search results) of a full rebuild of the changed corpus, touches only
the affected groups and shards, and the alias switches atomically."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from longrag.config import LongRAGConfig
from longrag.index.alias import AliasError, BuildPointer, publish, read_pointer, resolve_build
from longrag.index.artifacts import ArtifactStore, load_shard_units, read_documents, write_documents, write_shard
from longrag.index.chunking import chunk_units
from longrag.index.manifest import Manifest
from longrag.index.maxp import MaxPIndex
from longrag.index.plan import assign_shards
from longrag.index.units import make_units
from longrag.index.update import (
    Changes,
    UpdateError,
    affected_documents,
    apply_changes,
    plan_update,
    read_delete_ids,
    unit_key,
    write_update,
)
from longrag.text.tokens import WhitespaceCounter
from longrag.types import Document
from tests.fakes import HashEncoder

WORDS = "river castle king music war city island bridge novel painter ship mountain".split()


def corpus(n: int, seed: int, start: int = 0) -> list[Document]:
    """Documents with a sparse random link graph (some links to titles outside the corpus) and a
    few shared titles, of 5-60 words."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(start, start + n):
        # ~0.4 links per document: many components (a denser graph has one giant component, which an
        # update regroups whole; its unchanged units still keep their ids and vectors)
        links = [f"T{int(j)}" for j in rng.integers(0, start + n + 20, int(rng.random() < 0.4))]
        text = " ".join(rng.choice(WORDS, int(rng.integers(5, 60))).tolist())
        title = f"T{i}" if rng.random() > 0.03 else f"T{max(0, i - 1)}"  # a few duplicate titles
        docs.append(Document(doc_id=str(i), title=title, text=text, links=links))
    return docs


def random_changes(docs: list[Document], seed: int) -> Changes:
    rng = np.random.default_rng(seed)
    ids = [d.doc_id for d in docs]
    picked = rng.choice(len(ids), 12, replace=False).tolist()
    deletes = [ids[i] for i in picked[:5]]
    changed = []
    for i in picked[5:10]:
        d = docs[i]
        changed.append(Document(doc_id=d.doc_id, title=d.title, text=d.text + " revised edition",
                                links=d.links + [f"T{int(rng.integers(0, len(docs)))}"]))
    same = Document(**docs[picked[10]].to_row())  # an upsert equal to the parent's document
    added = corpus(8, seed + 1, start=10_000)
    for j, d in enumerate(added):  # new documents link into the corpus (and one takes an existing title)
        d.links.append(f"T{int(rng.integers(0, len(docs)))}")
        if j == 0:
            d.title = docs[picked[11]].title
    return Changes(upserts=changed + [same] + added, deletes=deletes)


def _key_set(units) -> list[tuple]:
    return sorted((*unit_key(u), u.n_tokens) for u in units)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("kind", ["grouped", "document"])
def test_update_units_equal_a_full_rebuild(seed, kind):
    counter = WhitespaceCounter()
    docs = corpus(400, seed)
    parent = make_units(docs, kind=kind, counter=counter, budget=150)
    shard_of = assign_shards(parent, 3)
    by_shard = {s: [u for u, t in zip(parent, shard_of) if t == s] for s in range(3)}
    changes = random_changes(docs, seed + 100)
    plan = plan_update(docs, by_shard, changes, kind=kind, counter=counter, budget=150)
    new_docs, kinds = apply_changes(docs, changes)
    full = make_units(new_docs, kind=kind, counter=counter, budget=150)
    assert _key_set(plan.units) == _key_set(full)
    assert len(kinds["unchanged"]) == 1 and len(kinds["added"]) == 8 and len(kinds["deleted"]) == 5
    # untouched parent units keep their ids; only the regrouped part of the corpus is new
    parent_ids = {u.unit_id: unit_key(u) for u in parent}
    for u in plan.units:
        if u.unit_id in parent_ids:
            assert parent_ids[u.unit_id] == unit_key(u)
        else:
            assert u.unit_id in plan.new_unit_ids
    assert plan.stats["regrouped_documents"] < len(new_docs) / 2
    assert len(plan.new_unit_ids) < len(full) / 3
    assert set(plan.rebuild) | set(plan.reuse) == {0, 1, 2}


def test_affected_set_follows_title_resolution_and_both_graphs():
    a = Document("a", "A", "x", ["B"])
    b = Document("b", "B", "x", [])
    c = Document("c", "C", "x", ["D"])
    d = Document("d", "D", "x", [])
    e = Document("e", "E", "x", [])
    old = [a, b, c, d, e]
    # a new document titled "E" is appended (E still resolves to e); it links to C
    new = old + [Document("f", "E", "x", ["C"])]
    assert affected_documents(old, new, {"f"}) == {"f", "c", "d"}
    # deleting b cuts a loose: a is regrouped; e is untouched
    assert affected_documents(old, [a, c, d, e], {"b"}) == {"a", "b"}


def test_bad_changes_are_named():
    docs = corpus(20, 0)
    with pytest.raises(UpdateError, match=r"cannot delete documents the build does not hold: \['nope'\]"):
        apply_changes(docs, Changes(deletes=["nope"]))
    with pytest.raises(UpdateError, match=r"both added and deleted.*\['3'\]"):
        apply_changes(docs, Changes(upserts=[docs[3]], deletes=["3"]))
    counter = WhitespaceCounter()
    units = make_units(docs, kind="grouped", counter=counter, budget=150)
    with pytest.raises(UpdateError, match="not a grouping of its documents"):
        plan_update(docs[:-1], {0: units}, Changes(deletes=["0"]), kind="grouped", counter=counter, budget=150)
    assert read_delete_ids("1\n\n# a comment\n 2  # trailing\n") == ["1", "2"]
    # units grouped along computed links: no update, a rebuild (any document changes them everywhere)
    for links in ("titles", "tfidf", "both"):
        with pytest.raises(UpdateError, match=f"computed links \\(units.links={links}\\).*rebuild with jobs.index"):
            plan_update(docs, {0: units}, Changes(deletes=["0"]), kind="grouped", counter=counter, budget=150,
                        links=links)
    doc_units = make_units(docs, kind="document", counter=counter)
    plan_update(docs, {0: doc_units}, Changes(deletes=["0"]), kind="document", counter=counter, links="tfidf")


# ------------------------------------------------------------------------------ builds on disk
CONFIG = LongRAGConfig.model_validate({"units": {"max_group_tokens": 150}, "index": {"shards": 3}})
MAX_TOKENS = 40


def _embed(texts: list[str]) -> np.ndarray:
    return HashEncoder().encode_passages(list(texts))


def full_build(root, docs: list[Document], real: bool = False) -> ArtifactStore:
    """A complete build of ``docs`` in process (as jobs.index builds it), embedded with HashEncoder
    (``real``: with the config's bundled MiniLM and its tokenizer, as jobs.update embeds)."""
    counter, embed, max_tokens, dim = WhitespaceCounter(), _embed, MAX_TOKENS, HashEncoder.dim
    if real:
        from longrag.index.embedding import Embedder, tokenizer_dir
        from longrag.index.plan import chunk_limits
        from longrag.text.tokens import counter_for_model_dir

        embedder = Embedder(CONFIG.embedding)
        counter = counter_for_model_dir(tokenizer_dir(CONFIG.embedding.model))
        embed, max_tokens, dim = embedder.encode_passages, chunk_limits(CONFIG)[1], embedder.dim
    store = ArtifactStore.open(str(root))
    units = make_units(docs, kind="grouped", counter=counter, budget=CONFIG.units.max_group_tokens)
    shard_of = assign_shards(units, CONFIG.index.shards)
    manifest = Manifest.create(CONFIG, dim=dim, documents=len(docs))
    for s in range(CONFIG.index.shards):
        su = sorted([u for u, t in zip(units, shard_of) if t == s], key=lambda u: u.unit_id)
        chunks = chunk_units(su, max_tokens, counter)
        index = MaxPIndex.build(embed([c.text for c in chunks]), [c.chunk_id for c in chunks],
                                [c.unit_id for c in chunks])
        manifest.add_shard(write_shard(store, s, su, chunks, index))
    manifest.artifacts["documents.parquet"] = write_documents(store, docs)
    manifest.mark_complete()
    store.write_manifest(manifest)
    return store


def _search(store: ArtifactStore, queries: np.ndarray, k: int) -> list[list[tuple]]:
    from longrag.index.artifacts import load_shard
    from longrag.index.maxp import merge_topk

    m = store.read_manifest()
    loaded = [load_shard(store, s) for s in m.shard_ids]
    per = [idx.search(queries, k) for idx, _ in loaded]
    keys = {}
    for _, units in loaded:
        for uid in units.ids():
            keys[uid] = unit_key(units[uid])
    return [[(keys[h.unit_id], round(h.score, 5)) for h in merge_topk([p[q] for p in per], k)]
            for q in range(len(queries))]


def test_written_update_searches_like_a_full_rebuild(tmp_path):
    docs = corpus(300, 7)
    parent = full_build(tmp_path / "parent", docs)
    changes = random_changes(docs, 8)
    counter = WhitespaceCounter()
    pm = parent.read_manifest()
    plan = plan_update(read_documents(parent), {s: load_shard_units(parent, s) for s in pm.shard_ids}, changes,
                       kind="grouped", counter=counter, budget=150)
    calls: list[int] = []

    def embed(texts):
        calls.append(len(texts))
        return _embed(texts)

    with pytest.raises(UpdateError, match=r"shape \(\d+, 5\).*64 dimensions"):
        write_update(parent, ArtifactStore.open(str(tmp_path / "wrong")), plan, embed=lambda t: np.ones((len(t), 5)),
                     counter=counter, max_tokens=MAX_TOKENS)
    out = ArtifactStore.open(str(tmp_path / "update"))
    manifest = write_update(parent, out, plan, embed=embed, counter=counter, max_tokens=MAX_TOKENS)
    assert manifest.status == "complete" and manifest.parent.build_id == pm.build_id
    assert manifest.parent.changes["added"] == 8 and manifest.parent.shards_rebuilt == plan.rebuild
    report = json.loads(out.storage.read_bytes("build_report.json"))
    new_chunks = chunk_units([u for u in plan.units if u.unit_id in plan.new_unit_ids], MAX_TOKENS, counter)
    assert sum(calls) == report["chunks_embedded"] == len(new_chunks)  # only the new units were embedded
    for s in plan.reuse:  # reused shards are byte-identical copies
        assert manifest.shard(s).files == pm.shard(s).files
    new_docs, _ = apply_changes(docs, changes)
    assert [d.doc_id for d in read_documents(out)] == [d.doc_id for d in new_docs]
    rebuilt = full_build(tmp_path / "full", new_docs)
    queries = HashEncoder().encode_queries(["river castle", "king music war", "novel painter", "ship island"])
    assert _search(out, queries, 8) == _search(rebuilt, queries, 8)
    # the unit link graph (retrieval.mode=graph) of every unit again, kept and new: a link between two
    # documents links their units (a title names its first document), checked by hand
    from longrag.index.artifacts import read_unit_graph

    graph = read_unit_graph(out)
    units = {u.unit_id: u for s in manifest.shard_ids for u in load_shard_units(out, s)}
    assert sorted(graph.unit_ids) == sorted(units)
    assert all(int(graph.shards[i]) == next(s for s in manifest.shard_ids if u in {x.unit_id for x in
               load_shard_units(out, s)}) for i, u in enumerate(graph.unit_ids[:20]))
    unit_of = {d: uid for uid, u in units.items() for d in u.doc_ids}
    first = {}
    for d in new_docs:
        first.setdefault(d.title, d.doc_id)
    want = {(unit_of[d.doc_id], unit_of[first[t]]) for d in new_docs for t in d.links if t in first}
    want = {e for a, b in want if a != b for e in ((a, b), (b, a))}
    got = {(graph.unit_ids[i], graph.unit_ids[j]) for i in range(graph.n_units) for j in graph.neighbours(i).tolist()}
    assert got == want and len(want) > 20
    # the BM25 half (retrieval.mode=hybrid): every rebuilt shard has the BM25 index of exactly its new
    # chunks, in FAISS order (reused shards kept theirs: their files are the parent's, above). Scores
    # are not compared with the full rebuild's: BM25 statistics are per shard, and the rebuild puts
    # units on other shards (docs/evaluation.md: hybrid, sharded against one process).
    from longrag.index.artifacts import load_shard, load_shard_chunks, load_shard_lexical
    from longrag.index.lexical import LexicalIndex, require_lexical

    require_lexical(manifest)
    for s in plan.rebuild:
        index, _ = load_shard(out, s)
        chunks = load_shard_chunks(out, s)
        fresh = LexicalIndex.build([chunks[str(c)].text for c in index.chunk_ids])
        for text in ("river castle", "king music war", "ship island"):
            np.testing.assert_allclose(load_shard_lexical(out, s).scores(text), fresh.scores(text), rtol=1e-6)


# ------------------------------------------------------------------------------ the alias
def test_alias_publish_resolve_and_refusals(tmp_path):
    docs = corpus(60, 3)
    a = full_build(tmp_path / "alias" / "builds" / "a", docs)
    alias = str(tmp_path / "alias")
    with pytest.raises(AliasError, match="neither a build"):
        resolve_build(alias)
    p1 = publish(alias, a.uri)
    assert p1.uri == "builds/a" and p1.generation == 1
    assert resolve_build(alias) == (a.uri, p1)
    assert resolve_build(a.uri) == (a.uri, None)
    b = full_build(tmp_path / "b", corpus(60, 4))  # outside the alias root: stored as an absolute URI
    with pytest.raises(AliasError, match="another update was published first"):
        publish(alias, b.uri, expect_build_id="some-other-build")
    p2 = publish(alias, b.uri, expect_build_id=p1.build_id)
    assert p2.previous_build_id == p1.build_id and p2.generation == 2 and resolve_build(alias)[0] == b.uri
    incomplete = tmp_path / "c"
    full_build(incomplete, docs)
    m = ArtifactStore.open(str(incomplete)).read_manifest()
    m.status = "building"
    ArtifactStore.open(str(incomplete)).write_manifest(m)
    with pytest.raises(AliasError, match="not complete"):
        publish(alias, str(incomplete))
    with pytest.raises(AliasError, match="is a build, not an alias root"):
        publish(a.uri, b.uri)


def test_pointer_switch_is_atomic_for_readers(tmp_path):
    alias = str(tmp_path / "alias")
    builds = [full_build(tmp_path / "alias" / "builds" / name, corpus(30, i)) for i, name in enumerate("ab")]
    publish(alias, builds[0].uri)
    ids = {b.read_manifest().build_id for b in builds}
    stop = threading.Event()
    seen: list[BuildPointer] = []
    errors: list[Exception] = []

    def reader():
        while not stop.is_set():
            try:
                seen.append(read_pointer(alias))
            except Exception as exc:  # a torn or missing pointer would land here
                errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(200):
            publish(alias, builds[(i + 1) % 2].uri)
    finally:
        stop.set()
        t.join()
    assert not errors and len(seen) > 50
    assert all(p is not None and p.build_id in ids for p in seen)
    assert read_pointer(alias).generation == 201


# ------------------------------------------------------------------------------ jobs.update
def test_update_job_on_an_alias(tmp_path, capsys):
    from jobs import update

    docs = corpus(40, 5)
    parent = full_build(tmp_path / "alias" / "builds" / "first", docs, real=True)
    alias = str(tmp_path / "alias")
    publish(alias, parent.uri)
    add = tmp_path / "add.jsonl"
    add.write_text(json.dumps({"doc_id": "900", "title": "Zanzibar", "text": "Zanzibar is an island off Tanzania.",
                               "links": ["T3"]}) + "\n")
    delete = tmp_path / "delete.txt"
    delete.write_text("4\n")
    assert update.main(["--build", alias, "--delete", str(tmp_path / "missing.txt")]) == 1
    assert "missing.txt" in capsys.readouterr().err
    assert update.main(["--build", alias, "--add", str(add), "--delete", str(delete)]) == 0
    result = json.loads(capsys.readouterr().out)
    build_uri, pointer = resolve_build(alias)
    assert pointer.build_id == result["build_id"] and pointer.previous_build_id == parent.read_manifest().build_id
    new = ArtifactStore.open(build_uri)
    m = new.read_manifest()
    assert m.parent.build_id == parent.read_manifest().build_id and m.parent.changes["added"] == 1
    units = [u for s in m.shard_ids for u in load_shard_units(new, s)]
    assert any("900" in u.doc_ids for u in units) and not any("4" in u.doc_ids for u in units)
    # the new document's link to T3 is in the new build's unit graph (retrieval.mode=graph)
    from longrag.index.artifacts import read_unit_graph

    graph = read_unit_graph(new)
    zanzibar = next(u.unit_id for u in units if "900" in u.doc_ids)
    t3 = next(u.unit_id for u in units if "3" in u.doc_ids)
    linked = {graph.unit_ids[j] for j in graph.neighbours(graph.position[zanzibar]).tolist()}
    assert sorted(graph.unit_ids) == sorted(u.unit_id for u in units) and (zanzibar == t3 or t3 in linked)
    # deleting it again is refused, naming the id
    assert update.main(["--build", alias, "--delete", str(delete)]) == 1
    assert "['4']" in capsys.readouterr().err
