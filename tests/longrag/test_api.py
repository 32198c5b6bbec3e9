"""``from longrag import ...``: every entry point the package names resolves to its module's own
object, lazily; the docstring's search walk-through runs on a small build."""

import importlib
import subprocess
import sys

import pytest

import longrag
from tests.fakes import HashEncoder, write_tiny_build


def test_every_export_is_the_modules_own_object():
    for name, module in longrag._EXPORTS.items():
        assert getattr(longrag, name) is getattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        longrag.nothing  # noqa: B018


def test_import_longrag_stays_light():
    code = "import sys, longrag; print(sorted(m for m in ('torch', 'faiss', 'pydantic') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_search_a_build_through_the_exports(tmp_path):
    from longrag import ArtifactStore, load_shard, merge_topk

    root = write_tiny_build(tmp_path / "b", [("Animal Farm", "Animal Farm is a novella by George Orwell."),
                                              ("Zanzibar", "Zanzibar is an island off Tanzania."),
                                              ("Luanda", "Luanda is the capital of Angola.")], shards=2)
    store = ArtifactStore.open(root)
    q = HashEncoder().encode_queries(["Who wrote the novella Animal Farm?"])
    hits = merge_topk([load_shard(store, s)[0].search(q, 2)[0] for s in range(2)], 1)
    units = [load_shard(store, s)[1] for s in range(2)]
    best = next(lookup[hits[0].unit_id] for lookup in units if hits[0].unit_id in lookup)
    assert best.titles == ["Animal Farm"]
