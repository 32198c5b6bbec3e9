"""A real headless Chromium for the web playground's tests: Debian's ``chromium`` package (``make
setup`` installs it when ``/usr/bin/chromium`` is missing) driven by Playwright for Python, with a
fresh profile per test. Never ``playwright install``: it downloads a browser build of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("LONGRAG_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    """The browser binary; a clear error (not a skip) when it is missing."""
    path = CHROMIUM if os.path.isabs(CHROMIUM) else shutil.which(CHROMIUM)
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError(f"no Chromium at {CHROMIUM}: `make setup` installs Debian's package as root, "
                           "or run `sudo apt-get install -y chromium` (LONGRAG_CHROMIUM names another binary)")
    return path


@contextlib.contextmanager
def browser_page(profile_dir: Path, width: int = 1200, height: int = 1000) -> Iterator[Any]:
    """A page of a headless Chromium with a fresh profile (``--user-data-dir``) in ``profile_dir``.
    Console errors and uncaught page errors are collected in ``page.problems``."""
    from playwright.sync_api import sync_playwright

    profile_dir.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile_dir), executable_path=chromium_path(), headless=True, args=ARGS,
            viewport={"width": width, "height": height})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}")
                    if msg.type == "error" else None)
            page.problems = problems  # type: ignore[attr-defined]
            yield page
        finally:
            context.close()


def ask(page: Any, base_url: str, question: str, *, k: int, strategy: str = "", key: str | None = None,
        timeout_s: float = 60, mode: str = "") -> dict[str, Any]:
    """Load the playground, ask ``question`` and wait for the answer; returns what the page shows:
    answer, long answer, evidence units (titles, used, best chunk, which search found it), trace
    stages, status. ``mode``: the retrieval select ("" = the server's default)."""
    page.goto(base_url + "/")
    page.wait_for_selector("body[data-ready='yes']", timeout=30_000)
    if key is not None:
        page.fill("#api-key", key)
    page.fill("#question", question)
    page.fill("#k", str(k))
    page.select_option("#strategy", strategy)
    page.select_option("#mode", mode)
    page.click("#ask")
    page.wait_for_function(
        "document.body.dataset.answered === 'yes' || document.querySelector('#status').classList.contains('error')",
        timeout=timeout_s * 1000)
    return page.evaluate("""() => ({
        status: document.querySelector('#status').textContent,
        error: document.querySelector('#status').classList.contains('error'),
        answer: document.querySelector('#answer').textContent,
        long_answer: document.querySelector('#long-answer').textContent,
        units: [...document.querySelectorAll('#evidence li.unit')].map((li) => ({
            unit: li.dataset.unit,
            titles: li.querySelector('.titles').textContent,
            used: li.classList.contains('is-used'),
            best_chunk: (li.querySelector('.best-chunk') || {}).textContent || null,
            found_by: (li.querySelector('.found-by') || {}).textContent || null,
            marks: [...li.querySelectorAll('.best-chunk mark')].map((m) => m.textContent),
        })),
        stages: [...document.querySelectorAll('#trace .seg')].map((s) => s.dataset.stage),
    })""")
