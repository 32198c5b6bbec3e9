"""The Ray-free build plan: one definition of what decides a build (``BuildSettings``), used alike
by the resume check and by the evaluation's index fingerprint; units, shards and the plan digest."""

from __future__ import annotations

import pytest

from longrag.config import LongRAGConfig
from longrag.eval.plan import index_fingerprint
from longrag.index.artifacts import ArtifactStore
from longrag.index.manifest import Manifest
from longrag.index.plan import BuildSettings, ResumeError, assign_shards, plan_build, resume_decision
from longrag.types import Document, Unit

CORPUS = [{"path": "/x", "sha256": "a" * 64, "bytes": 10}]


def _docs(n: int = 12) -> list[Document]:
    return [Document(f"d{i}", f"Topic {i}", " ".join([f"Topic {i} is a subject about item {i}."] * (2 + i % 4)),
                     [f"Topic {i + 1}"] if i % 3 != 2 else []) for i in range(n)]


def _fp(config: LongRAGConfig, links: str = "titles") -> str:
    return index_fingerprint(CORPUS, BuildSettings.of(config), links=links)[0]


def test_build_settings_ignore_resources_serving_and_the_query_side():
    base = LongRAGConfig()
    same = base.with_overrides(["embedding.batch_size=8", "embedding.num_gpus=1", "embedding.concurrency=4",
                                "index.replicas=3", "llm.context_window=4096", "serve.port=9000",
                                "embedding.query_instruction='query: '", "index.search_params=nprobe=8"])
    assert BuildSettings.of(same) == BuildSettings.of(base)
    assert BuildSettings.of(base.model_dump(mode="json")) == BuildSettings.of(base)  # a manifest's dict works too
    for change in ("embedding.model=bge-large-en-v1.5", "units.max_group_tokens=2048", "chunking.max_tokens=128",
                   "index.shards=3", "index.factory=HNSW32", "embedding.normalize=false", "units.text_mode=lead",
                   "units.kind=document", "index.metric=l2"):
        changed = BuildSettings.of(base.with_overrides([change]))
        assert changed != BuildSettings.of(base), change
        assert change.split("=")[0] in changed.diff(BuildSettings.of(base)), change


def test_unit_fields_count_only_for_the_unit_kind_that_reads_them():
    doc = LongRAGConfig().with_overrides(["units.kind=document"])
    assert BuildSettings.of(doc.with_overrides(["units.max_group_tokens=100", "units.passage_words=50",
                                                "units.symmetric_links=false"])) == BuildSettings.of(doc)
    passage = LongRAGConfig().with_overrides(["units.kind=passage"])
    assert BuildSettings.of(passage.with_overrides(["units.passage_words=50"])) != BuildSettings.of(passage)
    assert "passage_words" not in BuildSettings.of(doc).as_dict()["units"]


def test_an_older_manifest_config_takes_the_defaults_of_missing_fields():
    dump = LongRAGConfig().model_dump(mode="json")
    del dump["units"]["symmetric_links"], dump["embedding"]["normalize"]
    assert BuildSettings.of(dump) == BuildSettings.of(LongRAGConfig())


# Pairs (base overrides, changed overrides): the old code's resume check and fingerprint disagreed on
# the first three (query_instruction was in one only; per-kind unit fields were dropped in one only).
PAIRS = [
    (["units.kind=grouped"], ["embedding.query_instruction='query: '"]),
    (["units.kind=document"], ["units.max_group_tokens=60"]),
    (["units.kind=passage"], ["units.symmetric_links=false"]),
    (["units.kind=grouped"], ["embedding.batch_size=7", "index.replicas=2"]),
    (["units.kind=grouped"], ["units.max_group_tokens=60"]),
    (["units.kind=passage"], ["units.passage_words=7"]),
    (["units.kind=document"], ["chunking.max_tokens=64"]),
    (["units.kind=document"], ["index.factory=SQ8"]),
    (["units.kind=document"], ["embedding.normalize=false"]),
    (["units.kind=document"], ["embedding.document_instruction='passage: '"]),
    (["units.kind=grouped"], ["index.shards=3"]),
]


@pytest.mark.parametrize("base,change", PAIRS, ids=[" ".join(b + c) for b, c in PAIRS])
def test_resume_and_the_evaluation_fingerprint_agree(tmp_path, base, change):
    """A build the evaluation would reuse (same fingerprint) is exactly one a resume accepts."""
    before = LongRAGConfig().with_overrides(["units.max_group_tokens=120", *base])
    after = before.with_overrides(change)
    docs = _docs()
    store = ArtifactStore.open(tmp_path / "build")
    manifest = Manifest.create(before, dim=384, documents=len(docs))
    manifest.plan = plan_build(docs, before).digests
    store.write_manifest(manifest)
    same_fingerprint = _fp(before) == _fp(after)
    try:
        keep, redo = resume_decision(store, store.read_manifest(), plan_build(docs, after))
    except ResumeError as exc:
        assert not same_fingerprint, f"resume refused a build the evaluation would reuse: {exc}"
        assert "build settings differ" in str(exc)
    else:
        assert same_fingerprint, "resume accepted a build the evaluation would not reuse"
        assert keep == {} and set(redo.values()) == {"not written"}


def test_fingerprint_tracks_what_changes_the_index():
    cfg = LongRAGConfig()
    fp, parts = index_fingerprint(CORPUS, BuildSettings.of(cfg), links="titles")
    assert fp == index_fingerprint([{**CORPUS[0], "path": "/elsewhere"}], BuildSettings.of(cfg), links="titles")[0]
    assert parts["links"] == "titles" and parts["unit"] == "grouped"
    changed = {
        "corpus": index_fingerprint([{**CORPUS[0], "sha256": "b" * 64}], BuildSettings.of(cfg), links="titles")[0],
        "size": index_fingerprint([{**CORPUS[0], "bytes": 11}], BuildSettings.of(cfg), links="titles")[0],
        "links": _fp(cfg, "tfidf"),
        "unit": _fp(cfg.with_overrides(["units.kind=document"])),
        "model": _fp(cfg.with_overrides(["embedding.model=/some/model"])),
        "budget": _fp(cfg.with_overrides(["units.max_group_tokens=1024"])),
        "extra": index_fingerprint(CORPUS, BuildSettings.of(cfg), links="titles", extra={"limit": 5})[0],
    }
    assert len({fp, *changed.values()}) == len(changed) + 1
    # links do not matter for document units
    doc = cfg.with_overrides(["units.kind=document"])
    assert _fp(doc) == _fp(doc, "tfidf")
    with pytest.raises(ValueError, match="links"):
        index_fingerprint(CORPUS, BuildSettings.of(cfg), links="web")


def test_link_source_decides_a_grouped_build_only():
    """``units.links`` and, with TF-IDF links, their settings decide a grouped build; nothing else reads them."""
    grouped = LongRAGConfig()
    of = BuildSettings.of
    assert of(grouped) == of(grouped.with_overrides(["units.tfidf_top_m=9"]))  # hyperlinks read no TF-IDF field
    titles = grouped.with_overrides(["units.links=titles"])
    tfidf = grouped.with_overrides(["units.links=tfidf"])
    assert len({of(grouped), of(titles), of(tfidf)}) == 3
    assert of(titles).diff(of(grouped)) == ["units.links"]
    assert of(tfidf) != of(tfidf.with_overrides(["units.tfidf_threshold=0.3"]))
    assert of(titles) == of(titles.with_overrides(["units.tfidf_threshold=0.3"]))
    doc = grouped.with_overrides(["units.kind=document"])
    assert of(doc) == of(doc.with_overrides(["units.links=tfidf"]))
    assert "links" not in of(grouped).as_dict()["units"]  # the default: earlier builds keep their fingerprint
    with pytest.raises(ValueError, match="tfidf_threshold"):
        grouped.with_overrides(["units.tfidf_threshold=0"])


def test_fingerprints_of_earlier_builds_still_match():
    """The fingerprint parts are unchanged by the move to BuildSettings, so the evaluation still
    reuses indexes built before it (digests computed with the earlier ``index_fingerprint``)."""
    expected = {
        "grouped": "2db8ac5890e81db775fb14137182dc772db2a0379fab53a7b2cb534b42df7b0e",
        "document": "fa6ba31fad2351d43a15464ccb0108fec6ef51d35c1ec411f0374b5570a3e279",
        "passage": "3a415ef9c3944a9720ad5c52cc2893d089df60200525cba71e24c5a08b092b39",
    }
    for unit, digest in expected.items():
        assert _fp(LongRAGConfig().with_overrides([f"units.kind={unit}"])) == digest, unit


def test_shards_balance_tokens_and_never_split_a_unit():
    units = [Unit(f"u{i}", [f"d{i}"], [f"T{i}"], "x", n) for i, n in enumerate([50, 40, 30, 20, 10, 10])]
    shard_of = assign_shards(units, 2)
    load = [sum(u.n_tokens for u, s in zip(units, shard_of) if s == k) for k in range(2)]
    assert sorted(load) == [80, 80] and assign_shards(units, 2) == shard_of
    plan = plan_build(_docs(), LongRAGConfig().with_overrides(["units.max_group_tokens=120", "index.shards=3"]))
    owners = [u.unit_id for us in plan.units_by_shard.values() for u in us]
    assert sorted(owners) == sorted(u.unit_id for u in plan.units) and len(set(owners)) == len(owners)
    assert sorted(plan.digests) == ["0", "1", "2"] and plan.max_tokens == plan.model_max - 2
    assert {r["shard"] for r in plan.rows([1])} == {1}
