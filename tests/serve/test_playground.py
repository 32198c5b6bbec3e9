"""The web playground (``GET /``, serve/static) in a real headless Chromium (Debian's ``chromium``
driven by Playwright, see ``tests/browser.py``), over the Serve app with fakes (``tests/fakes.py``:
a hashing encoder, in-process shards of a tiny build, a reader that answers with the first unit's
title), with API keys configured so the page shows its key field and sends the key. The same page
with the real bundled models: ``tests/serve/test_app.py::test_playground_answers_with_the_real_models``."""

from __future__ import annotations

import httpx
import pytest

from serve.run import wait_healthy
from tests.browser import ask, browser_page
from tests.fakes import serve_fake_app, write_tiny_build

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)

PORT = 8414
KEY = "playground-key"
DOCS = [
    ("Animal Farm", "Animal Farm is a novel by George Orwell. It was published in 1945."),
    ("Luanda", "Luanda is the capital of Angola. It lies on the Atlantic coast."),
    ("Apollo 11", "Apollo 11 was the first spaceflight to land humans on the Moon in 1969."),
    ("Aruba", "Aruba is a country within the Kingdom of the Netherlands."),
]
BASE = f"http://127.0.0.1:{PORT}"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    build = write_tiny_build(tmp_path_factory.mktemp("tiny") / "build", DOCS, shards=2, links=[(1, 0)])
    # graph mode walks from the dense top 1 (Luanda links to Animal Farm, which the dense search ranks last)
    overrides = ["index.replicas=1", f"serve.api_keys=[{KEY}]", "retrieval.graph_depth=1", "retrieval.graph_seeds=1"]
    with serve_fake_app(build, PORT, overrides) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            wait_healthy(client)
            yield client


def test_page_and_its_files_load_without_a_key(app):
    """The page is open (the key is typed into it); the API behind it is not."""
    page = app.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/static/app.js"' in page.text
    assert app.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert app.get("/static/style.css").headers["content-type"].startswith("text/css")
    assert app.get("/static/secret.py").status_code == 401  # only the page's own files are open
    missing = app.get("/static/secret.py", headers={"Authorization": f"Bearer {KEY}"})
    assert missing.status_code == 404 and "app.js" in missing.json()["error"]["message"]
    assert app.get("/playground/config").json() == {"api_keys": True}
    assert app.post("/v1/retrieve", json={"question": "x"}).status_code == 401


def test_a_question_streams_an_answer_with_evidence_and_trace(app, tmp_path):
    with browser_page(tmp_path / "profile") as page:
        assert page.goto(BASE + "/").ok
        page.wait_for_selector("body[data-ready='yes']")
        assert page.is_visible("#api-key"), "API keys are configured: the page must show its key field"
        shown = ask(page, BASE, "Who wrote the novel Animal Farm?", k=2, key=KEY)
        screenshot = tmp_path / "playground-fakes.png"
        page.screenshot(path=str(screenshot), full_page=True)
        problems = page.problems
    assert not shown["error"], shown["status"]
    assert shown["answer"] == "Animal Farm"  # TitleReader: the first unit's title
    assert shown["long_answer"] == "The documents say: Animal Farm."  # streamed token by token, then whole
    assert [u["titles"] for u in shown["units"]][0] == "Animal Farm" and len(shown["units"]) == 2
    assert shown["units"][0]["used"] and shown["units"][0]["best_chunk"].startswith("Animal Farm is a novel")
    assert "Animal" in shown["units"][0]["marks"] and "Farm" in shown["units"][0]["marks"]
    assert {"encode", "retrieve", "read"} <= set(shown["stages"]), shown["stages"]
    assert screenshot.stat().st_size > 10_000
    assert problems == [], problems


def test_the_retrieval_select_reaches_the_index_and_shows_who_found_each_unit(app, tmp_path):
    """The page's retrieval select (here graph): the unit the link graph brought in shows "graph"."""
    with browser_page(tmp_path / "profile") as page:
        shown = ask(page, BASE, "What is the capital of Angola?", k=2, key=KEY, mode="graph")
        problems = page.problems
    assert not shown["error"], shown["status"]
    assert [(u["titles"], u["found_by"]) for u in shown["units"]] == [("Luanda", "dense"), ("Animal Farm", "graph")]
    assert shown["units"][1]["best_chunk"] in DOCS[0][1]
    assert problems == [], problems


def test_without_the_key_the_page_shows_the_401(app, tmp_path):
    with browser_page(tmp_path / "profile") as page:
        shown = ask(page, BASE, "Who wrote the novel Animal Farm?", k=2, key="wrong-key")
    assert shown["error"] and shown["status"].startswith("401 unauthorized"), shown["status"]
    assert shown["units"] == [] and shown["answer"] == ""


def test_a_dual_strategy_answers_with_its_stages_in_the_trace(app, tmp_path):
    with browser_page(tmp_path / "profile") as page:
        shown = ask(page, BASE, "What is the capital of Angola?", k=2, strategy="E&F", key=KEY)
    assert not shown["error"], shown["status"]
    assert shown["answer"].strip()
    assert shown["units"][0]["titles"] == "Luanda" and shown["units"][0]["best_chunk"]
    assert {"extractor", "filter", "generator"} <= set(shown["stages"]), shown["stages"]


def test_the_long_document_tab_reads_with_mixpr(app, tmp_path):
    document = "\n\n".join(text for _, text in DOCS)
    with browser_page(tmp_path / "profile") as page:
        page.goto(BASE + "/")
        page.wait_for_selector("body[data-ready='yes']")
        page.fill("#api-key", KEY)
        page.click("#tab-doc")
        assert page.is_visible("#document") and not page.is_visible("#question")
        page.fill("#document", document)
        page.fill("#doc-question", "What is the capital of Angola?")
        page.fill("#doc-k", "2")
        page.click("#doc-ask")
        page.wait_for_function("document.querySelector('#doc-status').textContent.startsWith('done')"
                               " || document.querySelector('#doc-status').classList.contains('error')")
        status = page.text_content("#doc-status")
        answer = page.text_content("#doc-answer")
        chunks = page.locator("#doc-chunks li").all_text_contents()
        stages = page.eval_on_selector_all("#doc-trace .seg", "els => els.map(e => e.dataset.stage)")
    assert status.startswith("done"), status
    assert answer.strip() and len(chunks) == 2 and any("Luanda" in c for c in chunks), (answer, chunks)
    assert "read" in stages, stages
