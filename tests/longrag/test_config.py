"""The typed config: overrides and YAML round trip (what decides a build: tests/longrag/test_build_plan.py)."""

import pytest
import yaml

from longrag.config import load_config


def test_overrides_parse_yaml_scalars_and_reject_unknown_keys(tmp_path):
    cfg = load_config(None, ["index.shards=4", "embedding.query_instruction=null", "units.kind=passage"])
    assert cfg.index.shards == 4 and cfg.embedding.query_instruction is None and cfg.units.kind == "passage"
    for bad in ("index.shards", "nosuch.field=1", "index.nosuch=1", "shards=2"):
        with pytest.raises(ValueError):
            load_config(None, [bad])
    with pytest.raises(ValueError):  # pydantic validation still applies
        load_config(None, ["index.shards=0"])
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    assert load_config(path) == cfg
