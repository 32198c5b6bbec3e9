"""``python -m jobs.lrg_instruct`` on Ray Data with a fake OpenAI-compatible teacher (a real HTTP
server): the ray.data.llm HTTP processor and the actor pool give the same records, teacher failures
are counted, a rerun resumes from the journal."""

from __future__ import annotations

import json

import pytest

import jobs.lrg_instruct as job
from longrag.data import MUSIQUE_SAMPLE, data_path
from tests.lrg_teacher import FakeTeacher

pytestmark = pytest.mark.ray("b")  # starts a local Ray (tests/conftest.py)

DATA = str(data_path(MUSIQUE_SAMPLE))
FAIL_Q = "Kim Jong-chul"  # a question among the first six kept MuSiQue questions
FALSE_Q = "Signmark"


@pytest.fixture(scope="module")
def ray_local():
    from cluster.local import start_or_join

    handle = start_or_join(None, num_cpus=2)
    yield handle
    handle.shutdown()


def run(out, url, engine, *extra):
    return job.main(["--data", DATA, "--teacher", url, "--model", "fake", "--out", str(out), "--limit", "6",
                     "--engine", engine, "--max-retries", "1", "--batch-size", "2", *extra])


def report(out) -> dict:
    return json.loads((out / "report.json").read_text())


def test_engines_agree_count_failures_and_resume(ray_local, tmp_path, capsys):
    assert job.ray_llm_available()  # ray.data.llm imports here: the endpoint path uses it
    outs = {}
    for engine in ("ray-llm", "actors"):
        out = tmp_path / engine
        with FakeTeacher(fail_marker=FAIL_Q, false_marker=FALSE_Q) as teacher:
            assert run(out, teacher.url, engine, "--qps", "50") == 0
            sent = len(teacher.requests)
        r = report(out)
        assert r["questions_kept"] == 6
        # 12 generations; the failed question's 2 get no verdict: 10 verdicts
        assert r["teacher_requests"] == 22 and r["teacher_errors"] == 2
        assert all("no reply" in e or "503" in e for e in r["teacher_error_examples"])
        k = r["kinds"]
        assert (k["extractor"]["kept"], k["extractor"]["errors"], k["extractor"]["rejected"]) == (4, 1, {"self-evaluation: false": 1})
        assert (k["cot"]["kept"], k["cot"]["errors"]) == (4, 1)
        assert k["task"]["kept"] == 6 and r["kept_ratio"] == pytest.approx(8 / 12, abs=1e-4)
        if engine == "actors":  # the project's OpenAI backend retried each failing call once
            assert sent == 22 + 2
        else:  # ray.data.llm retried the first failing call, then failed its block (both calls reported)
            assert sent >= 22
        outs[engine] = (out / "train.jsonl").read_text() + (out / "heldout.jsonl").read_text()
    assert outs["ray-llm"] == outs["actors"]

    # rerun into the same folder with a healthy teacher: only the two failed calls and their verdicts are sent
    out = tmp_path / "ray-llm"
    with FakeTeacher(false_marker=FALSE_Q) as teacher:
        assert run(out, teacher.url, "ray-llm") == 0
        assert len(teacher.requests) == 4
    r = report(out)
    assert r["teacher_errors"] == 0 and r["teacher_replies_reused"] == 20
    assert r["kinds"]["extractor"]["kept"] == 5


def test_bad_options_exit_2_with_a_message(capsys):
    assert job.main(["--data", DATA, "--teacher", "gpt-4", "--out", "x"]) == 2
    assert "bundled:NAME" in capsys.readouterr().err
    assert job.main(["--data", DATA, "--teacher", "http://h:1/v1", "--out", "x"]) == 2
    assert "--model" in capsys.readouterr().err
    assert job.main(["--data", DATA, "--teacher", "bundled", "--engine", "ray-llm", "--out", "x"]) == 2
    assert "needs an endpoint teacher" in capsys.readouterr().err
    assert job.main(["--data", "nope.json", "--teacher", "bundled", "--out", "x"]) == 2
    assert "nope.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        job.main(["--data", DATA, "--teacher", "bundled", "--out", "x", "--kinds", "extractor,summary"])
    assert e.value.code == 2 and "summary" in capsys.readouterr().err
