"""The distributed index build (issue 13, section 1): units assembled by Ray Data workers from the
driver's metadata-only plan equal the in-driver path (``make_units`` through ``plan_build``) -- ids,
member documents, texts, token counts and the shard plan digests -- on the bundled sample (as one
stream and as a multistream dump read stream by stream) and on a generated Wikipedia-like corpus
(JSONL files, and parquet split by row group)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors.distbuild import plan_corpus
from cluster.local import start_or_join
from lab.synthetic.wikigraph import write_wikilike_corpus
from longrag.config import load_config
from longrag.corpus.documents import documents_to_table, read_documents
from longrag.corpus.sources import plan_read_tasks, write_multistream
from longrag.index.artifacts import ArtifactStore
from longrag.index.distplan import staged_units_prefix
from longrag.index.plan import plan_build
from longrag.types import Unit
from tests.conftest import SAMPLE_WIKI

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)


@pytest.fixture(scope="module")
def cluster():
    handle = start_or_join(None, num_cpus=2)
    yield handle
    handle.shutdown()


def _staged(out, n_shards: int) -> dict[int, list[Unit]]:
    storage = ArtifactStore.open(str(out)).storage
    return {s: [Unit.from_row(r) for k in sorted(storage.list(staged_units_prefix(s)))
                for r in pq.read_table(io.BytesIO(storage.read_bytes(k))).to_pylist()] for s in range(n_shards)}


def _assert_same_units(plan, reference) -> None:
    assert plan.documents == reference.documents
    assert plan.units_per_shard() == reference.units_per_shard()
    assert plan.digests == reference.digests  # sha256 over ids, members, titles, token counts, texts
    # the unit link graph (retrieval.mode=graph): from the driver's positions and labels, as from the documents
    got, want = plan.graph, reference.graph
    assert got.unit_ids == want.unit_ids and got.shards.tolist() == want.shards.tolist()
    assert got.indptr.tolist() == want.indptr.tolist() and got.indices.tolist() == want.indices.tolist()


def _sample_reference(config):
    docs, _ = read_documents(str(SAMPLE_WIKI), "wikixml", text_mode="lead")
    docs.sort(key=lambda d: (len(d.doc_id), d.doc_id))  # the order the in-driver build used
    return plan_build(docs, config)


def test_sample_units_equal_the_in_driver_path(tmp_path, cluster):
    config = load_config(None, ["units.kind=grouped", "units.text_mode=lead", "index.shards=2"])
    reference = _sample_reference(config)
    out = tmp_path / "build"
    plan, report, corpus = plan_corpus(str(SAMPLE_WIKI), "wikixml", str(out), config)
    _assert_same_units(plan, reference)
    staged = _staged(out, plan.n_shards)
    for s, units in reference.units_by_shard.items():
        assert staged[s] == units  # the Unit records themselves, field by field
    assert any(len(u.doc_ids) > 1 for units in staged.values() for u in units)  # grouping did group
    # the parsed documents are an artifact of the build, with their provenance
    assert corpus.documents == report["n_ok"] == reference.documents
    assert sum(p.rows for p in corpus.parts) == reference.documents
    table = pa.concat_tables([pq.read_table(out / p.key) for p in corpus.parts])
    assert set(table.column_names) >= {"doc_id", "title", "text", "links", "n_tokens"}
    assert report["redirects"] > 0 and report["read_tasks"] == 1
    # the skipped page is reported by title, as the demo prints it
    assert [b["title"] for b in report["bad"]] == ["List of anthropologists"] and report["n_bad"] == 1


def test_multistream_dump_is_read_stream_by_stream(tmp_path, cluster):
    dump, index = write_multistream(SAMPLE_WIKI, tmp_path / "enwiki-multistream.xml.bz2", pages_per_stream=40)
    tasks = plan_read_tasks(str(dump), "wikixml")
    assert len(tasks) > 3 and all(t.kind == "stream" for t in tasks)
    config = load_config(None, ["units.kind=grouped", "units.text_mode=lead", "index.shards=2"])
    plan, report, _ = plan_corpus(str(dump), "wikixml", str(tmp_path / "build"), config)
    assert report["read_tasks"] == len(tasks)
    _assert_same_units(plan, _sample_reference(config))


def test_generated_corpus_units_equal_the_in_driver_path(tmp_path, cluster):
    files = write_wikilike_corpus(tmp_path / "corpus", 3000, n_files=4, seed=3)
    config = load_config(None, ["units.kind=grouped", "index.shards=3", "units.max_group_tokens=2048"])
    docs = [d for f in files for d in read_documents(str(f), "jsonl")[0]]
    reference = plan_build(docs, config)
    assert reference.grouping["n_units"] < len(docs)  # links do group documents here
    out = tmp_path / "build"
    # a folder source: its JSONL files, one read task each
    plan, report, _ = plan_corpus(str(tmp_path / "corpus"), "jsonl", str(out), config)
    assert report["read_tasks"] == 4 and report["n_bad"] == 0
    _assert_same_units(plan, reference)
    assert plan.graph.n_links > 100  # units link across the 4K-token budget
    staged = _staged(out, plan.n_shards)
    for s, units in reference.units_by_shard.items():
        assert staged[s] == units


def test_parquet_row_groups_and_passages(tmp_path, cluster):
    files = write_wikilike_corpus(tmp_path / "corpus", 300, n_files=1, seed=5)
    docs, _ = read_documents(str(files[0]), "jsonl")
    pq.write_table(documents_to_table(docs), tmp_path / "docs.parquet", row_group_size=64)
    tasks = plan_read_tasks(str(tmp_path / "docs.parquet"), "parquet")
    assert [t.row_group for t in tasks] == [0, 1, 2, 3, 4]
    for kind in ("passage", "document"):
        config = load_config(None, [f"units.kind={kind}", "index.shards=2", "units.passage_words=60"])
        plan, report, _ = plan_corpus(str(tmp_path / "docs.parquet"), "parquet", str(tmp_path / kind), config)
        assert report["read_tasks"] == 5 and report["n_ok"] == len(docs)
        _assert_same_units(plan, plan_build(docs, config))


def _hotpot_documents(n: int) -> list:
    """The bundled HotpotQA paragraphs as documents without hyperlinks (the first ``n`` titles)."""
    from longrag.data import HOTPOTQA_CORPUS, data_path
    from longrag.eval.corpus import load_corpus_file
    from longrag.types import Document

    pooled = load_corpus_file(data_path(HOTPOTQA_CORPUS))
    docs = [Document(doc_id=str(i), title=d.title, text=d.text) for i, d in enumerate(pooled.documents[:n])]
    assert not any(d.links for d in docs)
    return docs


def _reference_links(docs: list, links: str, cfg) -> list:
    """The in-memory reference: the title matcher over the whole corpus, and TF-IDF neighbours from
    scikit-learn on the whole matrix (hashed counts, ``TfidfTransformer``'s sublinear tf, smooth idf
    and L2 rows, ``cosine_similarity``, then the top-m by similarity, ties by position): none of the
    part-by-part code under test."""
    import numpy as np
    from sklearn.feature_extraction.text import HashingVectorizer, TfidfTransformer
    from sklearn.metrics.pairwise import cosine_similarity

    from longrag.index.titles import title_mention_links

    found: list[list[str]] = [[] for _ in docs]
    if links in ("titles", "both"):
        found = [list(d.links) for d in title_mention_links(docs)]
    if links in ("tfidf", "both"):
        counts = HashingVectorizer(n_features=cfg.tfidf_features, stop_words="english", alternate_sign=False,
                                   norm=None).transform([f"{d.title}\n{d.text}" for d in docs])
        sims = cosine_similarity(TfidfTransformer(sublinear_tf=True, smooth_idf=True).fit_transform(counts))
        np.fill_diagonal(sims, -1.0)
        for i, f in enumerate(found):
            order = sorted(range(len(docs)), key=lambda j: (-round(sims[i, j], 12), j))[: cfg.tfidf_top_m]
            f += [docs[j].title for j in order if sims[i, j] >= cfg.tfidf_threshold - 1e-9]
    from dataclasses import replace

    return [replace(d, links=f) for d, f in zip(docs, found)]


@pytest.mark.parametrize("links", ["both"])
def test_a_corpus_without_hyperlinks_is_grouped_along_computed_links(tmp_path, cluster, links):
    """``units.links``: the links computed part by part on Ray (actors/distlinks.py) group the units
    exactly as the in-memory references would (in-driver path over the same documents with those links).
    ``both`` runs both linkers (title mentions, then TF-IDF; a wrong link from either changes the
    groups); each alone was a minute more of the same Ray stages (``titles``/``tfidf`` pass here too)."""
    import json

    from longrag.corpus.documents import read_documents as read

    docs = _hotpot_documents(400)
    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(2):  # two files: two read tasks, parts of several sizes
        with open(src / f"part{i}.jsonl", "w") as fh:
            for d in docs[i * 250 : (i + 1) * 250]:
                fh.write(json.dumps({"id": d.doc_id, "title": d.title, "text": d.text}) + "\n")
    config = load_config(None, ["units.kind=grouped", "index.shards=2", "units.max_group_tokens=1024",
                                f"units.links={links}", "units.tfidf_top_m=3", "units.tfidf_threshold=0.15"])
    read_docs = [d for f in sorted(src.iterdir()) for d in read(str(f), "jsonl")[0]]
    reference = plan_build(_reference_links(read_docs, links, config.units), config)
    without = plan_build(read_docs, config)
    assert reference.grouping["n_units"] < without.grouping["n_units"] == len(read_docs)  # the links group
    plan, report, _ = plan_corpus(str(src), "jsonl", str(tmp_path / "build"), config)
    assert report["links"]["source"] == links and report["links"]["edges"] > 0
    _assert_same_units(plan, reference)


def test_embedding_pool_grows_from_one_actor_and_a_set_concurrency_is_fixed(cluster):
    """The pool is Ray Data's autoscaling actor pool, 1 up to one actor per CPU the cluster offers
    (2 here): a few chunks start one actor (one model load), and every vector equals the model's
    own encode; ``embedding.concurrency`` gives a fixed pool of that size."""
    import numpy as np
    import ray

    from actors.embedding import ChunkEmbedder, pool_options
    from longrag.config import EmbeddingConfig
    from longrag.index.embedding import Embedder

    emb = EmbeddingConfig(batch_size=4)
    opts = pool_options(emb)
    assert (opts["compute"].min_size, opts["compute"].max_size) == (1, 2)
    fixed = pool_options(emb.model_copy(update={"concurrency": 3}))["compute"]
    assert (fixed.min_size, fixed.max_size) == (3, 3)

    def embedders() -> set[str]:  # alive or already gone: every map worker that ran ChunkEmbedder
        return {actor_id for actor_id, a in ray._private.state.actors().items()
                if "ChunkEmbedder" in str(a.get("ActorClassName"))}

    before = embedders()
    texts = [f"Sentence number {i} about the Zambezi river." for i in range(6)]
    ds = ray.data.from_items([{"i": i, "text": t} for i, t in enumerate(texts)], override_num_blocks=1)
    rows = sorted(ds.map_batches(ChunkEmbedder, batch_size=emb.batch_size, **opts).take_all(), key=lambda r: r["i"])
    started = embedders() - before
    assert len(started) == 1, started  # one model load for six chunks, not one per CPU
    want = Embedder(emb).encode_passages(texts)
    np.testing.assert_allclose(np.stack([r["vector"] for r in rows]), want, atol=1e-5)


def test_a_tokenizing_stage_feeds_the_pool_the_same_vectors(cluster):
    """``embedding.tokenize=stage`` (the GPU layout: auto picks it when the pool has GPUs), forced on this
    CPU cluster: Ray Data's tokenizing actors send token ids sorted by length, the pool only runs the
    model; every row comes back with the vector of the model's own encode, the ids gone."""
    import numpy as np
    import ray

    from actors.embedding import embed
    from longrag.config import EmbeddingConfig
    from longrag.index.embedding import Embedder

    emb = EmbeddingConfig(batch_size=4, tokenize="stage")
    texts = [f"Chunk {i}: " + "the Zambezi falls into the gorge " * (i % 7) for i in range(23)]
    ds = ray.data.from_items([{"i": i, "text": t} for i, t in enumerate(texts)], override_num_blocks=3)
    rows = sorted(embed(ds, emb).take_all(), key=lambda r: r["i"])
    assert [r["i"] for r in rows] == list(range(len(texts))) and [r["text"] for r in rows] == texts
    assert all("input_ids" not in r for r in rows)
    want = Embedder(emb).encode_passages(texts)
    np.testing.assert_allclose(np.stack([r["vector"] for r in rows]), want, atol=2e-6)
    # a query pool (the evaluation's): the query prompt, through the same stage
    q = embed(ray.data.from_items([{"question": "Where are the falls?"}]), emb, role="query", column="question")
    np.testing.assert_allclose(q.take_all()[0]["vector"], Embedder(emb).encode_queries(["Where are the falls?"])[0],
                               atol=2e-6)
