"""The suite's exit (tests/conftest.py): pytest's status survives the ``os._exit`` that skips the
interpreter's finalization, and the summary is printed first. (A llama.cpp model left open is
closed by its own atexit hook: tests/longrag/test_llm_real.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("LONGRAG_TEST_FINALIZE", raising=False)
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    return pytester


@pytest.mark.parametrize(("body", "status"), [("assert 1 == 1", 0), ("assert 1 == 2", 1)])
def test_status_and_summary_survive_the_exit(suite, body, status):
    suite.makepyfile(f"def test_one():\n    {body}\n")
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == status
    result.stdout.fnmatch_lines(["*1 passed*" if status == 0 else "*1 failed*"])


def test_no_tests_keeps_pytests_status(suite):
    suite.makepyfile("def test_one():\n    pass\n")
    assert suite.runpytest_subprocess("-k", "nothing").ret == pytest.ExitCode.NO_TESTS_COLLECTED
