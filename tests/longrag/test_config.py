"""The typed config: overrides, YAML round trip, and which fields decide a build's content."""

import pytest

from longrag.config import LongRAGConfig, build_settings, load_config


def test_overrides_parse_yaml_scalars_and_reject_unknown_keys(tmp_path):
    cfg = load_config(None, ["index.shards=4", "embedding.query_instruction=null", "units.kind=passage"])
    assert cfg.index.shards == 4 and cfg.embedding.query_instruction is None and cfg.units.kind == "passage"
    for bad in ("index.shards", "nosuch.field=1", "index.nosuch=1", "shards=2"):
        with pytest.raises(ValueError):
            load_config(None, [bad])
    with pytest.raises(ValueError):  # pydantic validation still applies
        load_config(None, ["index.shards=0"])
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


def test_build_settings_ignore_resources_and_serving():
    base = LongRAGConfig()
    same = base.with_overrides(["embedding.batch_size=8", "embedding.num_gpus=1", "embedding.concurrency=4",
                                "index.replicas=3", "llm.context_window=4096", "serve.port=9000"])
    assert build_settings(same) == build_settings(base)
    assert build_settings(base.model_dump(mode="json")) == build_settings(base)  # a manifest's dict works too
    for change in ("embedding.model=bge-large-en-v1.5", "units.max_group_tokens=2048", "chunking.max_tokens=128",
                   "index.shards=3", "index.factory=HNSW32", "embedding.normalize=false"):
        assert build_settings(base.with_overrides([change])) != build_settings(base), change
