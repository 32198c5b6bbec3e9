"""What the ingress checks before a request reaches an endpoint: API keys, a per-client rate limit,
the body size, and CORS (``serve.api_keys``, ``serve.rate_limit_rps``, ``serve.max_body_bytes``,
``serve.cors_origins``). No Ray here: :mod:`serve.app` installs it as middleware.

* API keys are optional: none configured, no key is needed. With keys, a request without
  ``Authorization: Bearer <key>`` (or ``X-API-Key: <key>``) or with an unknown key gets 401.
  Keys come from ``serve.api_keys`` and from the file named by the environment variable
  ``serve.api_keys_file_env`` (one key a line, ``#`` comments). They are compared in constant time
  and never logged: the config holds them as secrets (masked in dumps), a client is named in
  logs and metrics by a short hash of its key.
* Rate limit: a token bucket per client (its key, or its address without keys): ``rate_limit_rps``
  tokens a second, at most ``rate_limit_burst`` at once; an empty bucket gets 429 with
  ``Retry-After`` (whole seconds). Buckets live in each ingress replica, least recently used first: a
  bucket idle long enough to be full again is dropped (a new one is the same), and past
  ``MAX_BUCKETS`` clients the least recently used goes even if not yet full (that client gets a
  fresh burst), so many clients cannot grow the replica's memory without bound.
* Body size: a POST whose body exceeds its limit gets 413 (``/v1/longcontext``: the document limit
  ``mixpr.max_document_bytes`` plus ``max_body_bytes`` for the rest of the request).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

from longrag.config import LongRAGConfig
from longrag.ratelimit import TokenBucket

MAX_BUCKETS = 65_536  # clients with a bucket per ingress replica (a bucket is ~200 bytes)


def load_api_keys(config: LongRAGConfig, environ: dict[str, str] | None = None) -> list[str]:
    """The keys of ``serve.api_keys`` plus those of the file named by ``serve.api_keys_file_env``."""
    env = os.environ if environ is None else environ
    keys = [k.get_secret_value() for k in config.serve.api_keys]
    name = config.serve.api_keys_file_env
    path = env.get(name) if name else None
    if path:
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"{name}={path}: no such file (it should hold one API key a line)")
        for line in file.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    return keys


def client_label(key: str) -> str:
    """How logs and metrics name the holder of ``key``: never the key itself."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


class Guard:
    """The checks of one ingress replica, from its config."""

    def __init__(self, config: LongRAGConfig, environ: dict[str, str] | None = None) -> None:
        s = config.serve
        self.keys = [k.encode() for k in load_api_keys(config, environ)]
        self.rate, self.burst = s.rate_limit_rps, s.rate_limit_burst
        self.max_body = s.max_body_bytes
        self.max_document = config.mixpr.max_document_bytes
        self.cors_origins = list(s.cors_origins)
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()  # least recently used first
        self.max_buckets = MAX_BUCKETS
        self._lock = threading.Lock()

    def body_limit(self, path: str) -> int:
        return self.max_body + (self.max_document if path.endswith("/v1/longcontext") else 0)

    def authenticate(self, authorization: str | None, x_api_key: str | None) -> tuple[str | None, str | None]:
        """``(client label, None)`` for a good or unneeded key, ``(None, problem)`` otherwise."""
        if not self.keys:
            return None, None
        given = x_api_key
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                return None, "the Authorization header must be 'Bearer <API key>'"
            given = value.strip()
        if not given:
            return None, "an API key is required: send 'Authorization: Bearer <API key>'"
        raw = given.encode()
        if not any(hmac.compare_digest(raw, k) for k in self.keys):
            return None, "the API key is not valid"
        return client_label(given), None

    def throttle(self, client: str, now: float | None = None) -> int:
        """0 when ``client`` may go on, else the whole seconds to wait (``Retry-After``)."""
        if not self.rate:
            return 0
        now = time.monotonic() if now is None else now
        with self._lock:
            bucket = self._buckets.pop(client, None)
            if bucket is None:
                bucket = TokenBucket(self.rate, self.burst, stamp=now)
            wait = bucket.take(now)
            self._buckets[client] = bucket  # now the most recently used
            self._evict(now)
        return 0 if wait == 0 else max(1, math.ceil(wait))

    @property
    def clients(self) -> int:
        """Clients holding a bucket now."""
        return len(self._buckets)

    def _evict(self, now: float) -> None:
        buckets = self._buckets
        while buckets:
            oldest = next(iter(buckets.values()))
            if oldest.full_at() <= now or len(buckets) > self.max_buckets:
                buckets.popitem(last=False)
            else:
                break
