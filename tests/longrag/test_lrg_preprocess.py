"""LRGinstruction pre-processing (Zhao et al., 2024, Section 3.2 and Appendix C.1): the
context-length rule, all supporting paragraphs kept, distractors sampled to half of P."""

from __future__ import annotations

import pytest

from longrag.data import HOTPOTQA_SAMPLE, MUSIQUE_SAMPLE, data_path
from longrag.eval.datasets import Paragraph, QAExample, load_qa
from longrag.lrg.preprocess import preprocess, preprocess_example
from longrag.lrg.records import LRGConfig


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def example(n_sup=2, n_dis=8, words_each=100, qid="q1") -> QAExample:
    paras = [Paragraph(f"S{i}", words(words_each), True) for i in range(n_sup)]
    paras += [Paragraph(f"D{i}", words(words_each), False) for i in range(n_dis)]
    return QAExample(qid, "Who?", ["Ann"], [f"S{i}" for i in range(n_sup)], [], "bridge", paragraphs=paras)


def count(text: str) -> int:
    return len(text.split())


def test_balanced_keeps_all_supporting_and_as_many_distractors():
    for n_sup, n_dis in [(2, 8), (3, 17), (4, 2), (2, 0)]:
        s, why = preprocess_example(example(n_sup, n_dis), "hotpotqa", "src", LRGConfig(min_context_tokens={}), count)
        assert why is None
        assert len(s.supporting) == n_sup  # every supporting paragraph
        assert len(s.distracting) == min(n_sup, n_dis)  # each half of P where there are enough
        assert {p.title for p in s.supporting} == {f"S{i}" for i in range(n_sup)}


def test_random_strategy_draws_between_two_and_all_distractors():
    cfg = LRGConfig(min_context_tokens={}, distractors="random")
    seen = set()
    for k in range(40):
        s, _ = preprocess_example(example(2, 9, qid=f"q{k}"), "hotpotqa", "src", cfg, count)
        n = len(s.distracting)
        assert 2 <= n <= 9
        seen.add(n)
    assert len(seen) > 3  # it really varies between questions


def test_sampling_is_seeded_and_shuffled():
    cfg = LRGConfig(min_context_tokens={})
    a, _ = preprocess_example(example(2, 8), "hotpotqa", "src", cfg, count)
    b, _ = preprocess_example(example(2, 8), "hotpotqa", "src", cfg, count)
    assert a == b
    others = [preprocess_example(example(2, 8, qid=f"x{k}"), "hotpotqa", "src", cfg, count)[0] for k in range(20)]
    assert len({tuple(p.title for p in s.paragraphs) for s in others}) > 5
    assert any(not s.paragraphs[0].supporting for s in others)  # supporting ones are not always first


def test_context_length_rule_per_format():
    cfg = LRGConfig()  # the paper's thresholds: 1.5k HotpotQA/2Wiki, 2.5k MuSiQue
    ex = example(2, 8, words_each=200)  # 2,000 tokens in all
    assert preprocess_example(ex, "hotpotqa", "s", cfg, count)[1] is None
    assert preprocess_example(ex, "2wiki", "s", cfg, count)[1] is None
    assert preprocess_example(ex, "musique", "s", cfg, count) == (None, "context too short")
    at = example(2, 8, words_each=149)  # 10 x (149 + title) = 1,500 exactly: kept (only "lower" is dropped)
    assert preprocess_example(at, "hotpotqa", "s", cfg, count)[1] is None
    below = example(2, 8, words_each=148)
    assert preprocess_example(below, "hotpotqa", "s", cfg, count) == (None, "context too short")
    # the rule counts all of a question's paragraphs (titles included), before sampling
    s, _ = preprocess_example(ex, "hotpotqa", "s", cfg, count)
    assert s.context_tokens == 10 * 201


def test_unusable_questions_are_dropped_with_reasons():
    cfg = LRGConfig(min_context_tokens={})
    no_sup = example(0, 5)
    assert preprocess_example(no_sup, "hotpotqa", "s", cfg, count) == (None, "no supporting paragraph")
    no_par = QAExample("q", "Who?", ["A"], [], [], "open")
    assert preprocess_example(no_par, "nq_open", "s", cfg, count) == (None, "no paragraphs")


def test_bundled_samples_counts_and_limit():
    hp = load_qa(data_path(HOTPOTQA_SAMPLE))
    mu = load_qa(data_path(MUSIQUE_SAMPLE))
    cfg = LRGConfig()
    h, h_drop = preprocess(hp.examples, hp.format, "hp", cfg, count)
    m, m_drop = preprocess(mu.examples, mu.format, "mu", cfg, count)
    totals = [sum(count(f"{p.title}\n{p.text}") for p in e.paragraphs) for e in hp.examples]
    assert len(h) == sum(t >= 1500 for t in totals) and h_drop["context too short"] == 100 - len(h)
    assert len(m) + m_drop["context too short"] == 100
    for s in h + m:
        assert len(s.distracting) == len(s.supporting)
    limited, _ = preprocess(mu.examples, mu.format, "mu", cfg, count, limit=3)
    assert [s.qid for s in limited] == [s.qid for s in m[:3]]


def test_config_rejects_unknown_kind():
    with pytest.raises(ValueError, match="'extractor', 'cot', 'filter' or 'task'"):
        LRGConfig(kinds=("extractor", "summary"))
