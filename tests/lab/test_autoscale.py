"""lab.autoscale without Ray: the burst over real HTTP to a local server (127.0.0.1), the
timeline's queries, and the plot as a real PNG."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lab.autoscale import AutoscaleFigures, BurstPlan, Sample, Timeline, burst, plot, scaled_down


class App:
    """/v1/retrieve: 200 with a coverage (degraded while ``degraded`` is set); /v1/answer: 200, or a
    JSON 503 while ``failing``. Each request takes ``delay_s``; the paths are recorded."""

    def __init__(self, delay_s: float = 0.01) -> None:
        self.paths: list[str] = []
        self.delay_s, self.failing, self.degraded = delay_s, False, False
        self.most_at_once, self._now = 0, 0
        app, lock = self, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    app.paths.append(self.path)
                    app._now += 1
                    app.most_at_once = max(app.most_at_once, app._now)
                time.sleep(app.delay_s)
                cov = {"degraded": app.degraded, "redundancy_degraded": False, "failed_shards": [0] if app.degraded
                       else [], "failovers": 0}
                if self.path == "/v1/answer" and app.failing:
                    status, body = 503, {"error": {"code": "unavailable", "message": "read failed", "detail": {}}}
                else:
                    status, body = 200, {"coverage": cov, "trace": {}}
                data = json.dumps(body).encode()
                # done before the body goes out: once the client has its reply it may send the next
                # request, which must not find this one still counted (the count ran 5 of 4 in CI)
                with lock:
                    app._now -= 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def app():
    a = App()
    yield a
    a.close()


def test_burst_sends_its_count_at_its_concurrency_with_every_nth_an_answer(app):
    tl = Timeline()
    fired = []
    plan = BurstPlan(requests=40, concurrency=4, max_s=60, answer_every=5)
    outcomes = asyncio.run(burst(app.base, plan, tl, at=(10, lambda: fired.append(tl.now()))))
    assert len(outcomes) == 40 == len(app.paths) == len(tl.requests)
    assert app.paths.count("/v1/answer") == 8 and app.most_at_once <= 4
    assert all(o.status == 200 for o in outcomes) and tl.in_flight == 0
    assert len(fired) == 1  # the fault ran once, while the burst went on
    assert all(start <= end for start, end, _, _ in tl.requests)


def test_burst_records_failures_and_degraded_answers(app):
    app.failing, app.degraded = True, True
    tl = Timeline()
    outcomes = asyncio.run(burst(app.base, BurstPlan(requests=12, concurrency=3, answer_every=3), tl))
    failed = [o for o in outcomes if o.status != 200]
    assert len(failed) == 4 and all(o.status == 503 and o.json_error for o in failed)
    assert sum(o.degraded for o in outcomes) == 8  # retrieves flagged degraded from their coverage
    assert sum(1 for _, _, status, _ in tl.requests if status == 503) == 4


def test_burst_stops_at_its_time_limit():
    slow = App(delay_s=0.3)
    try:
        t0 = time.monotonic()
        outcomes = asyncio.run(burst(slow.base, BurstPlan(requests=1000, concurrency=2, max_s=1.0), Timeline()))
        assert time.monotonic() - t0 < 3 and 2 <= len(outcomes) < 20
    finally:
        slow.close()


def _timeline() -> Timeline:
    tl = Timeline()
    shape = [({}, {}), ({"cpu": 1}, {}), ({"cpu": 2, "index_cpu": 1}, {"QueryEncoder": 1, "LLMServer": 1}),
             ({"cpu": 3, "index_cpu": 1}, {"QueryEncoder": 2, "LLMServer": 1}),
             ({"cpu": 2, "index_cpu": 1}, {"QueryEncoder": 1, "LLMServer": 1})]
    for i, (nodes, replicas) in enumerate(shape):
        tl.samples.append(Sample(float(i), nodes, replicas, in_flight=i))
    tl.events.append((1.0, "deploy"))
    tl.requests += [(2.0, 2.5, 200, False), (2.1, 3.0, 200, True), (2.2, 3.5, 503, False)]
    return tl


def test_timeline_queries():
    tl = _timeline()
    assert tl.event("deploy") == 1.0 and tl.event("nope") is None
    assert tl.first(0, lambda s: sum(s.nodes.values()) > 0) == 1.0
    assert tl.first(2, lambda s: s.nodes.get("cpu", 0) == 2) == 2.0
    assert tl.peak_nodes() == {"cpu": 3, "index_cpu": 1} and tl.peak_nodes(0, 1) == {"cpu": 1}
    assert tl.replica_range(2) == {"QueryEncoder": [1, 2], "LLMServer": [1, 1]}



def test_scaled_down_allows_only_the_nodes_that_hold_shards():
    before = Sample(0.0, {"cpu": 2, "index_cpu": 2}, {"Retriever": 1}, 0)
    scaled = ["Retriever", "QueryEncoder"]
    assert scaled_down(Sample(9.0, {"cpu": 2, "index_cpu": 2}, {"Retriever": 1, "LLMServer": 3}, 0), before, scaled, {})
    assert not scaled_down(Sample(9.0, {"cpu": 2, "index_cpu": 2}, {"Retriever": 2}, 0), before, scaled, {})
    assert not scaled_down(Sample(9.0, {"cpu": 3, "index_cpu": 2}, {"Retriever": 1}, 0), before, scaled, {"index_cpu": 2})
    # the killed node's replicas respread over two new nodes: three index nodes, each holding a shard
    three = Sample(9.0, {"cpu": 2, "index_cpu": 3}, {"Retriever": 1}, 0)
    assert scaled_down(three, before, scaled, {"index_cpu": 3})
    assert not scaled_down(three, before, scaled, {"index_cpu": 2})  # one of them idle: it must go
    assert not scaled_down(Sample(9.0, {"cpu": 2, "gpu_l4": 1}, {}, 0), before, scaled, {})  # a new type

def test_plot_writes_a_png(tmp_path):
    path = plot(_timeline(), tmp_path / "t.png", title="test")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_figures_are_one_json_line():
    line = AutoscaleFigures(passed=True, wall_s=1.0, replicas={"Reader": [1, 2]}).line()
    assert "\n" not in line and json.loads(line)["replicas"] == {"Reader": [1, 2]}
