"""Every job CLI answers a bad option value with a usage error (exit status 2) that names the bad
value and the valid ones, before any work starts: never a traceback (issue 9: ``python -m
jobs.bench_mixpr --tasks qa2`` died with an IndexError)."""

from __future__ import annotations

import importlib

import pytest

CASES = [
    # bench_mixpr
    ("jobs.bench_mixpr", ["--tasks", "qa2"], ["--tasks", "'qa2'", "hashhop_N", "babilong_qa2"]),
    ("jobs.bench_mixpr", ["--tasks", "hashhop_x"], ["--tasks", "'hashhop_x'", "hashhop_N"]),
    ("jobs.bench_mixpr", ["--tasks", "hashhop_0"], ["--tasks", "'hashhop_0'"]),
    ("jobs.bench_mixpr", ["--timing-docs", "novel"], ["--timing-docs", "'novel'", "babilong, hashhop"]),
    ("jobs.bench_mixpr", ["--timing-sizes", "1e6"], ["--timing-sizes", "'1e6'", "integer"]),
    ("jobs.bench_mixpr", ["--recall-sizes", "0"], ["--recall-sizes", "'0'"]),
    ("jobs.bench_mixpr", ["--formats", "poem"], ["--formats", "'poem'", "lines", "periods", "prose"]),
    ("jobs.bench_mixpr", ["--format-hops", "40"], ["--format-hops", "'40'", "[1, 16]"]),
    ("jobs.bench_mixpr", ["--seeds", "0"], ["--seeds", "'0'", ">= 1"]),
    ("jobs.bench_mixpr", ["--top-k", "0"], ["--top-k", "'0'", ">= 1"]),
    ("jobs.bench_mixpr", ["--hybrid", "maybe"], ["--hybrid", "'maybe'", "'auto', 'off'"]),
    # bench_index
    ("jobs.bench_index", ["--shard-sizes", "10,x,30"], ["--shard-sizes", "'x'"]),
    ("jobs.bench_index", ["--shard-sizes", "10,20"], ["--shard-sizes", "at least 3"]),
    ("jobs.bench_index", ["--vectors", "0"], ["--vectors", "'0'", ">= 1"]),
    ("jobs.bench_index", ["--usable-fraction", "1.5"], ["--usable-fraction", "'1.5'", "(0, 1]"]),
    ("jobs.bench_index", ["--factories", "Flat,Bogus7"], ["--factories", "'Bogus7'", "FAISS"]),
    ("jobs.bench_index", ["--plan-factories", "PQ100"], ["--plan-factories", "'PQ100'", "1024 dimensions"]),
    # index
    ("jobs.index", ["--source", "x.jsonl", "--format", "csv", "--out", "o"], ["--format", "'csv'", "'jsonl'"]),
    ("jobs.index", ["--source", "x.jsonl", "--format", "jsonl", "--out", "o", "--shards", "0"], ["--shards", "'0'"]),
    ("jobs.index", ["--source", "x.jsonl", "--format", "jsonl", "--out", "o", "--unit", "chapter"],
     ["--unit", "'chapter'", "'grouped'"]),
    ("jobs.index", ["--source", "x.jsonl", "--format", "jsonl", "--out", "o", "--num-cpus", "-1"], ["--num-cpus", "'-1'"]),
    # evaluate
    ("jobs.evaluate", ["--dataset", "squad", "--data", "d", "--out", "o"], ["--dataset", "'squad'", "'hotpotqa'"]),
    ("jobs.evaluate", ["--dataset", "hotpotqa", "--data", "d", "--out", "o", "--k", "1,a"], ["--k", "'a'"]),
    ("jobs.evaluate", ["--dataset", "hotpotqa", "--data", "d", "--out", "o", "--unit", "chapter"],
     ["--unit", "grouped, document, passage"]),
    ("jobs.evaluate", ["--dataset", "hotpotqa", "--data", "d", "--out", "o", "--links", "web"],
     ["--links", "hyperlinks, titles, tfidf, both"]),
    ("jobs.evaluate", ["--dataset", "hotpotqa", "--data", "d", "--out", "o", "--pool", "some"], ["--pool", "'some'"]),
    ("jobs.evaluate", ["--dataset", "hotpotqa", "--data", "d", "--out", "o", "--reader-k", "0"], ["--reader-k", "'0'"]),
    ("jobs.evaluate", ["--dataset", "hotpotqa", "--data", "d", "--out", "o", "--encode", "gpu"],
     ["--encode", "'gpu'", "'driver'"]),
    # longcontext
    ("jobs.longcontext", ["--document", "d.txt", "--retriever", "dense"], ["--retriever", "'dense'", "'mixpr'"]),
    ("jobs.longcontext", ["--document", "d.txt", "--route", "medium"], ["--route", "'medium'", "'local'"]),
    ("jobs.longcontext", ["--document", "d.txt", "--k", "0"], ["--k", "'0'", ">= 1"]),
    ("jobs.longcontext", ["--document", "d.txt", "--torch-threads", "0"], ["--torch-threads", "'0'"]),
]


@pytest.mark.parametrize("module,argv,fragments", CASES, ids=[f"{m}:{' '.join(a[-2:])}" for m, a, _ in CASES])
def test_bad_option_value_is_a_usage_error(module, argv, fragments, capsys):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "usage:" in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


@pytest.mark.parametrize(
    "module,argv",
    [
        ("jobs.index", ["--source", "x.jsonl", "--format", "jsonl", "--out", "o", "--set", "units.kind=chapter"]),
        ("jobs.evaluate", ["--dataset", "hotpotqa", "--data", "d", "--out", "o", "--set", "reader.compression=zip"]),
    ],
)
def test_bad_config_override_is_refused_before_anything_starts(module, argv, capsys):
    """A bad ``--set`` value ends with exit status 2 and the config error, before Ray starts."""
    assert importlib.import_module(module).main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err
    assert argv[-1].split("=")[0] in err


def test_valid_values_still_parse():
    from jobs import bench_index, bench_mixpr, evaluate

    args = bench_mixpr.build_parser().parse_args(
        ["--tasks", "hashhop_3,babilong_qa2", "--formats", "periods,prose", "--timing-sizes", "1000", "--format-hops", "4"]
    )
    assert args.tasks == ["hashhop_3", "babilong_qa2"] and args.formats == ["periods", "prose"]
    assert args.timing_sizes == [1000] and args.format_hops == [4]
    assert bench_mixpr.build_parser().parse_args([]).tasks == bench_mixpr.DEFAULT_TASKS.split(",")
    assert bench_index.parse_args(["--shard-sizes", "5,6,7", "--factories", "Flat,IVF{nlist},SQ8"]).shard_sizes == [5, 6, 7]
    assert evaluate.parse_args(["--dataset", "hotpotqa", "--data", "d", "--out", "o", "--k", "4,1,4"]).ks == [1, 4]


# ------------------------------------------------------------------------------ the `longrag` command


def test_longrag_command_reaches_every_job_and_passes_the_rest_through(capsys):
    """``longrag <command>`` (``[project.scripts]``): every job module is a command, each command's
    module has a ``main``; ``--help`` lists them, an unknown command is a usage error (2), and the
    rest of the line goes to the job (its own ``--help``, its own usage errors)."""
    from pathlib import Path

    from jobs.__main__ import COMMANDS, main

    jobs_dir = Path(__file__).resolve().parents[2] / "jobs"
    modules = {f"jobs.{p.stem}" for p in jobs_dir.glob("*.py") if not p.stem.startswith("__")}
    commanded = {module for module, _ in COMMANDS.values()}
    assert modules <= commanded, modules - commanded
    assert all(callable(importlib.import_module(m).main) for m in commanded)

    assert main(["--help"]) == 0 and "bench-serve" in capsys.readouterr().out
    assert main(["indx"]) == 2 and "unknown command 'indx'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["index", "--help"])
    assert exit_.value.code == 0 and "--source" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["index", "--shards", "zero"])
    assert exit_.value.code == 2 and "--shards" in capsys.readouterr().err


def test_longrag_console_script_is_installed():
    """``pip install -e .`` put a ``longrag`` script beside the interpreter; it answers --help."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).with_name("longrag")
    assert script.is_file(), f"no {script}: reinstall with pip install -e ."
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "index" in out.stdout, out.stderr
