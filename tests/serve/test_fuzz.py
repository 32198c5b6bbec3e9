"""The served OpenAPI schema fuzzed with schemathesis: no request, valid or not, gets a 5xx, and
every POST body sent again chunked (no Content-Length) is answered in the same class (2xx or 4xx).

The app is the real one (deployments, ingress, ``ShardedIndex``, Serve) over the plain fakes of
``tests/fakes.py`` with the production configuration: its default stage deadlines, no keys. Input
handling is what is under test here; the deadlines and the faults of misbehaving backends are
``tests/serve/test_faults.py``'s (whose deadlines are seconds, so that a dual strategy over
``k=100`` chunks on a loaded 2-core machine could trip them: a 504 that says nothing of the input)."""

from __future__ import annotations

import httpx
import pytest

from longrag.config import LongRAGConfig
from tests.fakes import serve_fake_app, write_tiny_build

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)

PORT = 8440
APP = "fuzz"
DOCS = [
    ("Animal Farm", "Animal Farm is a novel by George Orwell. It was published in 1945."),
    ("Luanda", "Luanda is the capital of Angola. It lies on the Atlantic coast."),
    ("Apollo 11", "Apollo 11 was the first spaceflight to land humans on the Moon in 1969."),
]
FUZZ_EXAMPLES = 20  # per operation and mode: 8 operations x 2 modes x 20 keep the test well under 2 minutes
OPERATIONS = {"GET /livez", "GET /readyz", "GET /healthz", "POST /v1/retrieve", "POST /v1/answer", "GET /v1/models",
              "POST /v1/chat/completions", "POST /v1/longcontext"}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    build = write_tiny_build(tmp_path_factory.mktemp("tiny") / "build", DOCS, shards=2)
    with serve_fake_app(build, PORT, name=APP) as url:  # LongRAGConfig's defaults: the production deadlines
        yield url


def _send_chunked(url: str, body: bytes | str, headers) -> httpx.Response:
    """``body`` as a chunked request (``Transfer-Encoding: chunked``, in 7-byte pieces): the size
    limit and the JSON decoding must not depend on a Content-Length."""
    data = body.encode() if isinstance(body, str) else bytes(body)
    keep = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "transfer-encoding", "host")}
    return httpx.post(url, content=iter([data[i:i + 7] for i in range(0, len(data), 7)]), headers=keep,
                      timeout=120)


def test_the_production_deadlines_are_the_defaults():
    """What this module fuzzes under: minutes per stage, not the faults app's seconds."""
    timeouts = LongRAGConfig().serve.timeouts
    assert min(timeouts.encode_s, timeouts.retrieve_s) >= 30 and timeouts.dual_s >= 600


def test_fuzzed_requests_get_no_server_error(base_url):
    """Schemathesis generates requests from the served OpenAPI schema, valid ones (positive) and
    ones that break it (negative), for every operation: none may get a 5xx. (Driven through
    Hypothesis directly: schemathesis' pytest plugin does not run on pytest 9.)"""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} == OPERATIONS
    failures: list[str] = []
    calls: dict[int, int] = {}
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def fuzz(case) -> None:
                r = case.call(base_url=base_url, timeout=120)
                calls[r.status_code] = calls.get(r.status_code, 0) + 1
                if r.status_code >= 500:
                    failures.append(f"{op.method.upper()} {op.path} ({mode}): {r.status_code} {r.text[:300]}\n"
                                    f"  {case.as_curl_command()}")
                body = r.request.body
                if op.method.upper() == "POST" and body:  # the same bytes again, chunked (no Content-Length)
                    chunked = _send_chunked(base_url + op.path, body, r.request.headers)
                    calls["chunked"] = calls.get("chunked", 0) + 1
                    if chunked.status_code >= 500 or (chunked.status_code >= 400) != (r.status_code >= 400):
                        failures.append(f"{op.method.upper()} {op.path} ({mode}, chunked): {chunked.status_code} "
                                        f"{chunked.text[:300]} where the sized body got {r.status_code}")

            try:
                fuzz()
            except Unsatisfiable:  # nothing to break: an operation without parameters or body (GET)
                assert mode == GenerationMode.NEGATIVE and op.method.upper() == "GET", (op.path, mode)
    chunked = calls.pop("chunked", 0)
    assert chunked >= 4 * FUZZ_EXAMPLES, chunked  # the POST operations' bodies went chunked too
    total = sum(calls.values())
    assert not failures, f"{len(failures)} of {total} requests got a 5xx:\n" + "\n".join(failures[:10])
    assert total >= 6 * FUZZ_EXAMPLES, calls
    # both kinds reached the handlers: valid requests answered, broken ones refused with a 4xx
    assert calls.get(200, 0) >= FUZZ_EXAMPLES and sum(n for s, n in calls.items() if 400 <= s < 500) >= FUZZ_EXAMPLES, calls
