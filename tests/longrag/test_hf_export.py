"""The GGUF -> HuggingFace export's checks and cache logic, without converting (the conversion itself,
with transformers' GGUF loader, runs in tests/vllm: `make test-vllm`)."""

from __future__ import annotations

import json

import pytest

from longrag.llm.base import LLMError
from longrag.llm.hf_export import (
    STAMP,
    _source_stamp,
    default_export_dir,
    export_hf_model,
    export_is_current,
)


def test_bad_dtype_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"'int8' is not one of \['float32', 'bfloat16', 'float16'\]"):
        export_hf_model(dtype="int8")


def test_a_base_model_is_refused_naming_the_chat_models():
    with pytest.raises(LLMError, match=r"gemma3-270m.*base model.*qwen2.5-coder-0.5b-instruct"):
        export_hf_model("gemma3-270m")


def test_unknown_model_is_refused(tmp_path):
    with pytest.raises(LLMError, match="neither a bundled model"):
        export_hf_model("no-such-model")
    with pytest.raises(LLMError, match="GGUF file not found"):
        export_hf_model(str(tmp_path / "missing.gguf"))


def test_default_folder_is_in_the_model_cache_or_beside_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGRAG_MODEL_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    assert default_export_dir("qwen2.5-coder-0.5b-instruct", gguf) == tmp_path / "cache" / "qwen2.5-coder-0.5b-instruct-hf"
    assert default_export_dir(str(gguf), gguf) == tmp_path / "m-hf"


def test_stamp_must_match_the_source_file_and_settings(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    dest = tmp_path / "m-hf"
    dest.mkdir()
    stamp = _source_stamp(str(gguf), gguf, "float32")
    assert not export_is_current(dest, stamp)  # no stamp: an unfinished folder
    (dest / STAMP).write_text(json.dumps(stamp))
    assert not export_is_current(dest, stamp)  # stamp but no config.json
    (dest / "config.json").write_text("{}")
    assert export_is_current(dest, stamp)
    assert not export_is_current(dest, _source_stamp(str(gguf), gguf, "bfloat16"))  # other dtype
    gguf.write_bytes(b"GGUF" + b"\1" * 100)  # the source changed
    assert not export_is_current(dest, _source_stamp(str(gguf), gguf, "float32"))


def test_a_current_export_is_returned_without_converting(tmp_path):
    """A path model whose folder holds a matching stamp: returned as is (no transformers needed)."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    dest = tmp_path / "m-hf"
    dest.mkdir()
    (dest / "config.json").write_text("{}")
    (dest / STAMP).write_text(json.dumps(_source_stamp(str(gguf), gguf, "float32")))
    assert export_hf_model(str(gguf)) == dest
