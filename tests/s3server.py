"""A local S3-compatible server (moto) for tests that read or write ``s3://`` URIs."""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def moto_s3(*buckets: str) -> Iterator[str]:
    """Run a moto S3 server on a free local port with ``buckets`` created; yields its endpoint URL
    and sets ``LONGRAG_S3_ENDPOINT_URL`` (and dummy credentials) while it runs, so
    :func:`longrag.store.open_storage` reaches it. moto and boto3 are required (the dev extra)."""
    import boto3
    import moto.server as server_mod
    from moto.s3.responses import S3Response

    port = free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    mp = pytest.MonkeyPatch()
    # S3 evaluates a conditional PUT (If-Match / If-None-Match, which moto supports) atomically; moto's
    # threaded server checks the condition and stores the object in two steps, so two racing PUTs could
    # both pass its check: one PUT at a time here, as on S3 (tests/longrag/test_alias_race.py races them).
    put, lock = S3Response.put_object, threading.Lock()

    @functools.wraps(put)
    def one_put_at_a_time(self, *args, **kwargs):
        with lock:
            return put(self, *args, **kwargs)

    mp.setattr(S3Response, "put_object", one_put_at_a_time)
    try:
        for var, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "LONGRAG_S3_ENDPOINT_URL": endpoint,
        }.items():
            mp.setenv(var, value)
        client = boto3.client("s3", endpoint_url=endpoint)
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        mp.undo()
        server.stop()
