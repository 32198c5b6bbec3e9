"""Every index backend the Retriever may hold implements :class:`serve.backend.IndexBackend`, without Ray
running (issue 45, item 4).

``isinstance`` on a ``runtime_checkable`` Protocol only asks whether the names exist; the Retriever calls
the backends positionally and by keyword, and awaits them, so each method is compared with the
Protocol's own: async alike, the Protocol's parameters at the same places with the same names and
kinds, its defaults kept (a caller leaving one out gets the same value), anything more optional.
The constructors likewise against :class:`serve.backend.IndexBackendFactory` (``index_cls``)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from longrag.config import LongRAGConfig
from serve.backend import IndexBackend, IndexBackendFactory
from tests.fakes import FakeShardsIndex, SleepyIndex, write_tiny_build

DOCS = [("Angola", "Luanda is the capital of Angola."), ("Orwell", "George Orwell wrote Animal Farm.")]
P = inspect.Parameter
POSITIONAL = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)


def backend_classes() -> list[type]:
    from actors.inprocess_index import InProcessIndex
    from serve.index_app import ServeIndex

    return [ServeIndex, InProcessIndex, FakeShardsIndex, FakeShardsIndex.with_dead((0, 0)),
            FakeShardsIndex.with_flaky((0, 0)), SleepyIndex]


def protocol_methods(proto: type) -> dict[str, Callable[..., Any]]:
    """The methods the Protocol itself declares (not ``object``'s nor ``Protocol``'s)."""
    return {name: fn for name, fn in vars(proto).items() if inspect.isfunction(fn) and not name.startswith("_")}


def signature_problems(want: Callable[..., Any], have: Callable[..., Any], *, drop_first: bool = False) -> list[str]:
    """Where a call that ``want``'s signature allows would fail, or bind otherwise, on ``have``.
    ``drop_first``: ``want`` is a method and ``have`` a class (its constructor's signature has no self)."""
    problems = []
    if inspect.iscoroutinefunction(want) != inspect.iscoroutinefunction(have):
        problems.append(f"{'async' if inspect.iscoroutinefunction(want) else 'not async'} in the Protocol, "
                        f"{'async' if inspect.iscoroutinefunction(have) else 'not async'} here")
    wanted = list(inspect.signature(want).parameters.values())[1 if drop_first else 0:]
    params = list(inspect.signature(have).parameters.values())
    var_pos = any(p.kind is P.VAR_POSITIONAL for p in params)
    var_kw = any(p.kind is P.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in POSITIONAL]
    used: set[str] = set()

    def same_default(w: inspect.Parameter, h: inspect.Parameter) -> None:
        if w.default is not P.empty and h.default is P.empty:
            problems.append(f"{w.name}: optional in the Protocol (default {w.default!r}), required here")
        elif w.default is not P.empty and h.default != w.default:
            problems.append(f"{w.name}: default {h.default!r} here, {w.default!r} in the Protocol")

    for i, w in enumerate(p for p in wanted if p.kind in POSITIONAL):
        if i >= len(positional):
            if not var_pos:
                problems.append(f"{w.name}: the Protocol's positional parameter {i} is not taken here")
            continue
        h = positional[i]
        used.add(h.name)
        if w.kind is P.POSITIONAL_OR_KEYWORD and (h.name != w.name or h.kind is not P.POSITIONAL_OR_KEYWORD):
            problems.append(f"positional parameter {i}: {w.name!r} (by position or keyword) in the Protocol, "
                            f"{h.name!r} ({h.kind.description}) here")
        same_default(w, h)
    by_name = {p.name: p for p in params}
    for w in (p for p in wanted if p.kind is P.KEYWORD_ONLY):
        h = by_name.get(w.name)
        if h is None or h.kind not in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY):
            if not var_kw:
                problems.append(f"{w.name}: keyword-only in the Protocol, not taken by name here")
            continue
        used.add(h.name)
        same_default(w, h)
    for h in params:
        if h.name not in used and h.kind in (*POSITIONAL, P.KEYWORD_ONLY) and h.default is P.empty:
            problems.append(f"{h.name}: required here, unknown to the Protocol (its callers never pass it)")
    return problems


@pytest.mark.parametrize("cls", backend_classes(), ids=lambda c: c.__name__)
def test_every_backend_implements_every_method_of_the_protocol(cls):
    problems = []
    for name, want in protocol_methods(IndexBackend).items():
        have = inspect.getattr_static(cls, name, None)
        if have is None:
            problems.append(f"{name}: missing")
            continue
        problems += [f"{name}: {p}" for p in signature_problems(want, getattr(cls, name))]
    problems += [f"constructor: {p}" for p in signature_problems(IndexBackendFactory.__call__, cls, drop_first=True)]
    released = inspect.getattr_static(cls, "released", None)
    if released is not None and not isinstance(released, property):  # optional; read as a bool when there
        problems.append("released: not a property")
    assert not problems, f"{cls.__name__} is not an IndexBackend:\n" + "\n".join(problems)


def test_the_comparison_sees_what_would_break_a_caller():
    """The check itself: each way a backend could drift from the Protocol is caught."""
    want = protocol_methods(IndexBackend)

    async def renamed(self, queries, n: int, texts=None, fusion=None): ...
    async def new_default(self, query, k: int, evidence: bool = True): ...
    async def required_extra(self, hits, query=None, evidence: bool = True, *, deadline): ...
    async def short(self, queries, k: int): ...
    def not_async(self) -> None: ...
    async def wider(self, queries, k: int, texts=None, fusion=None, *args, trace=None, **kwargs): ...

    assert signature_problems(want["search"], renamed)
    assert signature_problems(want["search_units"], new_default)
    assert signature_problems(want["retrieve_units"], required_extra)
    assert signature_problems(want["search"], short)
    assert signature_problems(want["release"], not_async)
    assert signature_problems(want["search"], wider) == []  # more that is optional breaks no caller

    class Built:
        def __init__(self, index_uri, config, *, app_name=None, holder=None, ready_timeout_s=1.0) -> None: ...

    assert signature_problems(IndexBackendFactory.__call__, Built, drop_first=True) == []
    assert signature_problems(IndexBackendFactory.__call__, lambda index_uri, config: None, drop_first=True)


def test_built_backends_are_instances_of_the_protocol(tmp_path, monkeypatch):
    """Built over a tiny build (the Serve one with its application and handles faked), each holds its
    ``manifest`` and passes ``isinstance``; the classes are factories."""
    from actors.inprocess_index import InProcessIndex
    from serve import index_app as ia

    uri = write_tiny_build(tmp_path / "b", DOCS, shards=2)
    config = LongRAGConfig().index
    monkeypatch.setattr(ia, "holders_call", lambda method, *args: None)
    monkeypatch.setattr(ia, "ensure_index_app", lambda u, manifest, c, **kw: ia.index_app_name(manifest.build_id))
    monkeypatch.setattr(ia.serve, "get_deployment_handle", lambda *a, **k: SimpleNamespace())
    for cls in (ia.ServeIndex, InProcessIndex, FakeShardsIndex, SleepyIndex):
        assert isinstance(cls, IndexBackendFactory)
        backend = cls(uri, config, app_name="test", holder="r1")
        assert isinstance(backend, IndexBackend), cls.__name__
        assert len(backend.manifest.shards) == 2
        asyncio.run(backend.release())
    assert not isinstance(object(), IndexBackend)
