"""longrag.scoped: a setting changed inside the block and restored after, also when it raises;
a variable that did not exist is removed again."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from longrag import scoped


def test_environ_sets_and_restores_old_values_and_absences(monkeypatch):
    monkeypatch.setenv("LONGRAG_T_OLD", "before")
    monkeypatch.delenv("LONGRAG_T_NEW", raising=False)
    with pytest.raises(RuntimeError):
        with scoped.environ({"LONGRAG_T_OLD": "inside", "LONGRAG_T_NEW": "1"}):
            assert os.environ["LONGRAG_T_OLD"] == "inside" and os.environ["LONGRAG_T_NEW"] == "1"
            raise RuntimeError
    assert os.environ["LONGRAG_T_OLD"] == "before" and "LONGRAG_T_NEW" not in os.environ


def test_attribute_sets_and_restores():
    ctx = SimpleNamespace(use_datasource_v2=True)
    with scoped.attribute(ctx, "use_datasource_v2", False):
        assert ctx.use_datasource_v2 is False
    assert ctx.use_datasource_v2 is True
    with pytest.raises(AttributeError):
        with scoped.attribute(ctx, "missing", 1):
            pass
