"""The reranker training job on a tiny slice of the bundled data (a few CPU steps, real MiniLM)."""

from __future__ import annotations

import json

import pytest

from longrag.training.reranker import TrainerConfig, next_version_dir, train_reranker
from longrag.training.reranker_data import load_sources, make_pairs, recall_at_k, sample_negatives, split_by_question

pytestmark = pytest.mark.slow  # a real model: left out of `make test-fast`


def test_recall_at_k():
    assert recall_at_k([0.9, 0.1, 0.5], [1, 0, 1], 1) == 0.5
    assert recall_at_k([0.9, 0.1, 0.5], [1, 0, 1], 2) == 1.0
    assert recall_at_k([0.1, 0.2], [0, 0], 1) != recall_at_k([0.1, 0.2], [0, 0], 1)  # nan: no positives


def test_pairs_and_split_by_question_from_bundled_data():
    cfg = TrainerConfig(limit_per_source=20)
    examples, prov = load_sources(cfg.sources, cfg.limit_per_source)
    assert prov["hotpotqa"]["questions"] == 20 and prov["musique"]["questions"] == 20
    assert prov["hotpotqa"]["file"].startswith("data/hotpotqa/")
    train, held = split_by_question(examples, 0.25, seed=0)
    ids = lambda xs: {f"{s}:{e.qid}" for s, e in xs}  # noqa: E731
    assert ids(train).isdisjoint(ids(held)) and len(train) + len(held) == len(examples) and held
    assert split_by_question(examples, 0.25, seed=0) == (train, held)  # deterministic
    pairs = make_pairs(train)
    assert {p.label for p in pairs} == {0.0, 1.0}
    assert {p.qid for p in pairs} == ids(train)
    # HotpotQA: supporting paragraphs are the titles of supporting_facts
    src, ex = next(x for x in examples if x[0] == "hotpotqa")
    sup = {p.title for p in ex.paragraphs if p.is_supporting}
    assert sup == set(ex.gold_titles) and len(sup) >= 1


def test_sample_negatives_keeps_positives_and_caps_negatives_per_question():
    from longrag.training.reranker_data import RerankPair

    pairs = [RerankPair(q, "Q", f"{q}{i}", 1.0 if i < npos else 0.0) for q, npos in (("a", 1), ("b", 2)) for i in range(8)]
    got = sample_negatives(pairs, 2, seed=0)
    for q, npos in (("a", 1), ("b", 2)):
        mine = [p for p in got if p.qid == q]
        assert sum(p.label > 0 for p in mine) == npos and sum(p.label == 0 for p in mine) == 2 * npos
    assert got == [p for p in pairs if p in got]  # original order kept
    assert sample_negatives(pairs, 2, seed=0) == got and sample_negatives(pairs, None) == pairs


def test_bad_config_names_valid_values():
    with pytest.raises(ValueError, match="valid: \\['hotpotqa', 'musique'\\]"):
        TrainerConfig(sources=("squad",)).check()
    with pytest.raises(ValueError, match="max_steps must be a positive int, got 0"):
        TrainerConfig(max_steps=0).check()
    with pytest.raises(ValueError, match="valid: \\['bi-encoder', 'cross-encoder'\\]"):
        TrainerConfig(kind="colbert").check()  # type: ignore[arg-type]


def test_next_version_dir(tmp_path):
    assert next_version_dir(tmp_path).name == "minilm-reranker-v1"
    (tmp_path / "minilm-reranker-v1").mkdir()
    (tmp_path / "minilm-reranker-v7").mkdir()
    assert next_version_dir(tmp_path).name == "minilm-reranker-v8"


def test_hard_negatives_and_triples_one_positive_per_question_per_round():
    from longrag.training.reranker_data import Triple, hard_negative_order, make_triples, paragraph_text

    examples, _ = load_sources(TrainerConfig().sources, 4)
    # a scorer that likes long paragraphs: the "hardest" negative is the longest non-supporting one
    order = hard_negative_order(examples, lambda q, texts: [len(t) for t in texts])
    for src, ex in examples:
        neg = order[f"{src}:{ex.qid}"]
        sup = {paragraph_text(p.title, p.text) for p in ex.paragraphs if p.is_supporting}
        assert neg and not sup & set(neg) and [len(t) for t in neg] == sorted((len(t) for t in neg), reverse=True)
    rounds = make_triples(examples, order, rounds=3, seed=0)
    assert len(rounds) == 3
    for r, rnd in enumerate(rounds):
        assert len({t.qid for t in rnd}) == len(rnd) == len(examples)  # one triple per question per round
        for t in rnd:
            assert isinstance(t, Triple) and t.negative == order[t.qid][r % len(order[t.qid])]
    src, ex = examples[0]
    pos = [paragraph_text(p.title, p.text) for p in ex.paragraphs if p.is_supporting]
    key = f"{src}:{ex.qid}"
    assert [next(t.positive for t in rnd if t.qid == key) for rnd in rounds] == [pos[i % len(pos)] for i in range(3)]


def test_sample_negatives_hardest_first():
    from longrag.training.reranker_data import RerankPair

    pairs = [RerankPair("a", "Q", f"t{i}", 1.0 if i == 0 else 0.0) for i in range(6)]
    kept = sample_negatives(pairs, 2, hardness=lambda p: int(p.text[1:]))  # t5, t4 are the hardest
    assert [p.text for p in kept] == ["t0", "t4", "t5"]


@pytest.mark.parametrize("kind", ["bi-encoder", "cross-encoder"])
def test_train_on_tiny_set_writes_loadable_versioned_folder(tmp_path, kind):
    cfg = TrainerConfig(kind=kind, limit_per_source=6, heldout_fraction=0.34, max_steps=3, batch_size=4, max_length=96,
                        eval_k=(2,))  # fmt: skip
    report = train_reranker(tmp_path, cfg)
    out = tmp_path / "minilm-reranker-v1"
    assert report.output_dir == str(out) and report.version == "minilm-reranker-v1" and report.kind == kind
    saved = json.loads((out / "training_report.json").read_text())
    assert saved["kind"] == kind and saved["config"]["lr_used"] == cfg.lr
    assert saved["counts"]["steps"] == 3
    # cross-encoder: full batches of pairs; bi-encoder: a round's last batch of triples may be short
    assert saved["counts"]["examples_seen"] == 12 if kind == "cross-encoder" else 6 <= saved["counts"]["examples_seen"] <= 12
    assert saved["counts"]["train_questions"] + saved["counts"]["heldout_questions"] == 12
    assert set(saved["heldout"]["dense_before"]) == {"recall@2"} == set(saved["heldout"]["reranker_after"])
    after, before = saved["heldout"]["reranker_after"]["recall@2"], saved["heldout"]["dense_before"]["recall@2"]
    assert 0.0 <= after <= 1.0
    assert saved["heldout"]["better_than_dense"] == {"recall@2": after > before}
    assert any(n.startswith("WARNING") for n in saved["notes"]) == (after <= before)
    assert any("hard" in n for n in saved["notes"])
    if kind == "cross-encoder":
        assert saved["counts"]["train_pairs"] <= saved["counts"]["train_pairs_available"]
    else:
        assert saved["counts"]["train_triples"] >= 4
    assert saved["data"]["sources"]["musique"]["file"].startswith("data/musique/")
    assert saved["loss"]["first"] > 0
    # the folder is a reranker the retriever can load, and it scores pairs
    from longrag.dual.rerank import BiEncoderScorer, CrossEncoderScorer, load_reranker

    scorer = load_reranker(out)
    assert isinstance(scorer, BiEncoderScorer if kind == "bi-encoder" else CrossEncoderScorer) and scorer.kind == kind
    s = scorer.score("Who wrote Hamlet?", ["Hamlet is a play by Shakespeare.", "Bananas are yellow."])
    assert len(s) == 2 and all(isinstance(x, float) for x in s)
