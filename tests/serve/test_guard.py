"""The ingress's checks without a cluster (serve/guard.py): API keys from the config and from a
file, token buckets, body limits; part of `make test-fast`."""

from __future__ import annotations

import pytest

from longrag.config import LongRAGConfig
from serve.guard import Guard, client_label, load_api_keys


def _config(*overrides: str) -> LongRAGConfig:
    return LongRAGConfig().with_overrides(list(overrides))


def test_no_keys_configured_means_no_key_needed():
    guard = Guard(_config(), environ={})
    assert guard.authenticate(None, None) == (None, None)
    assert guard.authenticate("Bearer anything", None) == (None, None)


def test_keys_from_config_and_file(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# team keys\nfile-key-1\n\n  file-key-2  \n")
    cfg = _config("serve.api_keys=[config-key]")
    assert load_api_keys(cfg, {"LONGRAG_API_KEYS_FILE": str(keys)}) == ["config-key", "file-key-1", "file-key-2"]
    guard = Guard(cfg, environ={"LONGRAG_API_KEYS_FILE": str(keys)})
    assert guard.authenticate("Bearer file-key-2", None) == (client_label("file-key-2"), None)
    assert guard.authenticate(None, "config-key")[1] is None
    assert guard.authenticate(None, None)[1].startswith("an API key is required")
    assert guard.authenticate("Bearer nope", None)[1] == "the API key is not valid"
    assert guard.authenticate("Basic abc", None)[1].startswith("the Authorization header must be")
    with pytest.raises(ValueError, match="LONGRAG_API_KEYS_FILE=.*no such file"):
        load_api_keys(cfg, {"LONGRAG_API_KEYS_FILE": str(tmp_path / "missing")})


def test_keys_are_never_in_dumps_or_labels():
    cfg = _config("serve.api_keys=[s3cret-key]")
    assert "s3cret-key" not in str(cfg.model_dump(mode="json")) and "s3cret-key" not in repr(cfg)
    assert "s3cret" not in client_label("s3cret-key")
    # a saved config holds the mask, which is no key
    again = LongRAGConfig.model_validate(cfg.model_dump(mode="json"))
    assert again.serve.api_keys == []


def test_throttle_is_per_client_with_whole_retry_after_seconds():
    guard = Guard(_config("serve.rate_limit_rps=0.5", "serve.rate_limit_burst=2"), environ={})
    assert [guard.throttle("a"), guard.throttle("a")] == [0, 0]
    assert guard.throttle("a") == 2  # 1 token at 0.5/s: 2 s
    assert guard.throttle("b") == 0
    assert Guard(_config(), environ={}).throttle("a") == 0  # no limit configured


def test_body_limits():
    guard = Guard(_config("serve.max_body_bytes=2048", "mixpr.max_document_bytes=10000"), environ={})
    assert guard.body_limit("/v1/answer") == 2048
    assert guard.body_limit("/v1/longcontext") == 12048


def test_buckets_of_idle_clients_are_dropped_once_full_again():
    # 0.5 tokens/s, burst 2: full again 4 s after emptying
    guard = Guard(_config("serve.rate_limit_rps=0.5", "serve.rate_limit_burst=2"), environ={})
    for i in range(1000):
        assert guard.throttle(f"client-{i}", now=0.0) == 0
    assert guard.clients == 1000
    assert [guard.throttle("a", now=1.0), guard.throttle("a", now=1.0)] == [0, 0]
    assert guard.throttle("a", now=1.0) == 2
    # at 4.5 s the 1,000 one-request clients are full again (a new bucket is the same): dropped;
    # "a" emptied at 1.0 is not full before 5.0, and still owes its wait
    assert guard.throttle("b", now=4.5) == 0
    assert guard.clients == 2
    assert guard.throttle("a", now=4.5) == 0 and guard.throttle("a", now=4.5) == 1


def test_buckets_are_bounded_least_recently_used_first():
    guard = Guard(_config("serve.rate_limit_rps=0.5", "serve.rate_limit_burst=2"), environ={})
    guard.max_buckets = 100
    for i in range(10_000):
        guard.throttle(f"client-{i}", now=0.0)
    assert guard.clients == 100
    # the most recent clients keep their (spent) buckets; the first ones got evicted
    assert [guard.throttle("client-9999", now=0.0), guard.throttle("client-9999", now=0.0)] == [0, 2]
    assert guard.throttle("client-0", now=0.0) == 0
