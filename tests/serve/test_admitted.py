"""The ingress' admission middleware in process (serve/middleware.py ``Admitted``; issue 44): the
reader's routes refused with 503 + Retry-After at once past the admission, before the endpoint runs;
other routes never refused; the request's deadline set for the stages; a bad X-Request-Timeout a
422; an answer's pace measured, a failed one's not. No Ray: part of `make test-fast`."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from longrag.admission import Admission
from serve import stages
from serve.gateway import NoMetrics
from serve.middleware import Admitted, Guarded, SentStatus


def _app(admission: Admission, ran: list[str], seen_deadlines: list[float]):
    async def answer(request):
        ran.append(request.url.path)
        seen_deadlines.append(stages.request_deadline.get().timeout_s)
        await asyncio.sleep(0.2)
        return JSONResponse({"answer": "ok"}, status_code=200 if "fail" not in request.url.query else 500)

    async def retrieve(request):
        ran.append(request.url.path)
        return JSONResponse({"units": []})

    inner = Starlette(routes=[Route("/v1/answer", answer, methods=["POST"]),
                              Route("/v1/retrieve", retrieve, methods=["POST"])])
    return Admitted(inner, admission, 30.0, NoMetrics())


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def test_past_the_admission_the_reader_routes_get_503_at_once_and_retrieve_is_served():
    admission, ran, deadlines = Admission(2, max_wait_s=None), [], []
    app = _app(admission, ran, deadlines)

    async def go():
        async with _client(app) as c:
            held = [asyncio.ensure_future(c.post("/v1/answer")) for _ in range(2)]
            await asyncio.sleep(0.05)
            refused = await c.post("/v1/answer")
            served = await c.post("/v1/retrieve")
            return [r.status_code for r in await asyncio.gather(*held)], refused, served

    held, refused, served = asyncio.run(go())
    assert held == [200, 200] and served.status_code == 200
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
    err = refused.json()["error"]
    assert err["code"] == "overloaded" and err["detail"]["limit"] == 2, err
    assert ran.count("/v1/answer") == 2  # the refused one never reached the endpoint
    assert admission.in_flight == 0 and admission.finished == 2


def test_the_deadline_header_and_what_counts_as_an_answer():
    admission, ran, deadlines = Admission(4), [], []
    app = _app(admission, ran, deadlines)

    async def go():
        async with _client(app) as c:
            a = await c.post("/v1/answer", headers={"X-Request-Timeout": "2.5"})
            b = await c.post("/v1/answer", headers={"X-Request-Timeout": "999"})
            bad = await c.post("/v1/answer", headers={"X-Request-Timeout": "soon"})
            failed = await c.post("/v1/answer?fail=1")
            return a, b, bad, failed

    a, b, bad, failed = asyncio.run(go())
    assert a.status_code == b.status_code == 200 and deadlines[:2] == [2.5, 30.0]
    assert bad.status_code == 422 and "X-Request-Timeout" in bad.json()["error"]["message"]
    assert failed.status_code == 500 and admission.finished == 2  # a 500 is no measure of the reader's pace
    assert stages.request_deadline.get() is None


def test_sent_status_remembers_the_status_and_guarded_counts_it():
    counted: list[tuple[str, int]] = []

    class Metrics:
        def request(self, path, status):
            counted.append((path, status))

    class Open:
        keys, rate = (), None

    async def endpoint(request):
        return JSONResponse({}, status_code=418)

    app = Guarded(Starlette(routes=[Route("/x", endpoint)]), Open(), Metrics(), frozenset())

    async def go():
        async with _client(app) as c:
            return await c.get("/x")

    assert asyncio.run(go()).status_code == 418 and counted == [("/x", 418)]
    sent: list = []

    async def send(message):
        sent.append(message)

    tracker = SentStatus(send)
    asyncio.run(tracker({"type": "http.response.start", "status": 204}))
    assert tracker.status == 204 and len(sent) == 1
