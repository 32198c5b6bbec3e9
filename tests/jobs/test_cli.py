"""Every job CLI answers a bad option value with a usage error (exit status 2) that names the bad
value and the valid ones, before any work starts: never a traceback (issue 9: ``python -m
jobs.bench_mixpr --tasks qa2``, now ``longrag bench mixpr --tasks qa2``, died with an IndexError)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

CASES = [
    # bench mixpr (through the one entry point, as a user runs it)
    ("jobs.bench", ["mixpr", "--tasks", "qa2"], ["--tasks", "'qa2'", "hashhop_N", "babilong_qa2"]),
    ("jobs.bench", ["mixpr", "--tasks", "hashhop_x"], ["--tasks", "'hashhop_x'", "hashhop_N"]),
    ("jobs.bench", ["mixpr", "--tasks", "hashhop_0"], ["--tasks", "'hashhop_0'"]),
    ("jobs.bench", ["mixpr", "--timing-docs", "novel"], ["--timing-docs", "'novel'", "babilong, hashhop"]),
    ("jobs.bench", ["mixpr", "--timing-sizes", "1e6"], ["--timing-sizes", "'1e6'", "integer"]),
    ("jobs.bench", ["mixpr", "--recall-sizes", "0"], ["--recall-sizes", "'0'"]),
    ("jobs.bench", ["mixpr", "--formats", "poem"], ["--formats", "'poem'", "lines", "periods", "prose"]),
    ("jobs.bench", ["mixpr", "--format-hops", "40"], ["--format-hops", "'40'", "[1, 16]"]),
    ("jobs.bench", ["mixpr", "--seeds", "0"], ["--seeds", "'0'", ">= 1"]),
    ("jobs.bench", ["mixpr", "--top-k", "0"], ["--top-k", "'0'", ">= 1"]),
    ("jobs.bench", ["mixpr", "--hybrid", "maybe"], ["--hybrid", "'maybe'", "'auto', 'off'"]),
    # bench index
    ("jobs.bench", ["index", "--shard-sizes", "10,x,30"], ["--shard-sizes", "'x'"]),
    ("jobs.bench", ["index", "--shard-sizes", "10,20"], ["--shard-sizes", "at least 3"]),
    ("jobs.bench", ["index", "--vectors", "0"], ["--vectors", "'0'", ">= 1"]),
    ("jobs.bench", ["index", "--usable-fraction", "1.5"], ["--usable-fraction", "'1.5'", "(0, 1]"]),
    ("jobs.bench", ["index", "--factories", "Flat,Bogus7"], ["--factories", "'Bogus7'", "FAISS"]),
    ("jobs.bench", ["index", "--plan-factories", "PQ100"], ["--plan-factories", "'PQ100'", "1024 dimensions"]),
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
def test_bad_option_value_is_a_usage_error(module, argv, fragments, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # jobs.bench names the benchmark in sys.argv
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
    from jobs import evaluate
    from lab.bench.cli import index as bench_index
    from lab.bench.cli import mixpr as bench_mixpr

    args = bench_mixpr.build_parser().parse_args(
        ["--tasks", "hashhop_3,babilong_qa2", "--formats", "periods,prose", "--timing-sizes", "1000", "--format-hops", "4"]
    )
    assert args.tasks == ["hashhop_3", "babilong_qa2"] and args.formats == ["periods", "prose"]
    assert args.timing_sizes == [1000] and args.format_hops == [4]
    assert bench_mixpr.build_parser().parse_args([]).tasks == bench_mixpr.DEFAULT_TASKS.split(",")
    assert bench_index.parse_args(["--shard-sizes", "5,6,7", "--factories", "Flat,IVF{nlist},SQ8"]).shard_sizes == [5, 6, 7]
    assert evaluate.parse_args(["--dataset", "hotpotqa", "--data", "d", "--out", "o", "--k", "4,1,4"]).ks == [1, 4]


# ------------------------------------------------------------------------------ the `longrag` command


def test_longrag_command_reaches_every_job_and_passes_the_rest_through(capsys, monkeypatch):
    """``longrag <command>`` (``[project.scripts]``): every job module is a command, each command's
    module has a ``main``; ``--help`` lists them, an unknown command is a usage error (2), and the
    rest of the line goes to the job (its own ``--help``, its own usage errors)."""
    from jobs.__main__ import COMMANDS, main

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # `longrag X` names the command in sys.argv
    jobs_dir = Path(__file__).resolve().parents[2] / "jobs"
    modules = {f"jobs.{p.stem}" for p in jobs_dir.glob("*.py") if not p.stem.startswith("__")}
    commanded = {module for module, _ in COMMANDS.values()}
    assert modules <= commanded, modules - commanded
    assert all(callable(importlib.import_module(m).main) for m in commanded)

    assert main(["--help"]) == 0 and "\n  bench " in capsys.readouterr().out
    assert main(["indx"]) == 2 and "unknown command 'indx'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["index", "--help"])
    assert exit_.value.code == 0 and "--source" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["index", "--shards", "zero"])
    assert exit_.value.code == 2 and "--shards" in capsys.readouterr().err


def test_one_bench_entry_point_lists_and_runs_every_benchmark(capsys, monkeypatch):
    """``longrag bench <name>`` (``python -m jobs.bench <name>`` under ``ray job submit``) is the one
    way to run a benchmark: no ``jobs/bench_*.py`` is left, every module of ``lab/bench/cli/`` is a
    benchmark with a ``main``, ``--help`` names each with its line, the rest of the command line goes
    to the benchmark, an unknown one is a usage error (2), and the list comes without importing any."""
    from jobs.__main__ import COMMANDS
    from jobs.__main__ import main as longrag
    from jobs.bench import BENCHMARKS

    root = Path(__file__).resolve().parents[2]
    assert not sorted(p.name for p in (root / "jobs").glob("bench_*.py"))
    assert COMMANDS["bench"][0] == "jobs.bench" and not [c for c in COMMANDS if c.startswith("bench-")]
    assert len((root / "jobs" / "bench.py").read_text().splitlines()) <= 300
    cli = {f"lab.bench.cli.{p.stem}" for p in (root / "lab" / "bench" / "cli").glob("*.py") if p.stem != "__init__"}
    assert cli == {module for module, _ in BENCHMARKS.values()} and len(cli) == 15
    for name, (module, _) in BENCHMARKS.items():
        assert name == module.rsplit(".", 1)[1].replace("_", "-")
        assert callable(importlib.import_module(module).main) and importlib.import_module(module).__doc__

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert longrag(["bench", "--help"]) == 0
    listing = capsys.readouterr().out
    for name, (_, what) in BENCHMARKS.items():
        assert f"  {name} " in listing and what in listing, name
    assert longrag(["bench", "nope"]) == 2 and "unknown benchmark 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        longrag(["bench", "graph", "--help"])
    assert exit_.value.code == 0 and "--units" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        longrag(["bench", "shard_load", "--vectors", "many"])  # the module's spelling is taken too
    assert exit_.value.code == 2 and "--vectors" in capsys.readouterr().err

    code = ("import sys; from jobs.bench import main; rc = main(['--help']); "
            "assert not [m for m in sys.modules if m.startswith('lab.bench.cli.')]; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and all(f"  {name} " in out.stdout for name in BENCHMARKS), out.stderr
    out = subprocess.run([sys.executable, "-m", "jobs.bench", "--help"], cwd=root, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "python -m jobs.bench <benchmark>" in out.stdout, out.stderr


def test_longrag_console_script_is_installed():
    """``pip install -e .`` put a ``longrag`` script beside the interpreter; it answers --help."""
    script = Path(sys.executable).with_name("longrag")
    assert script.is_file(), f"no {script}: reinstall with pip install -e ."
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "index" in out.stdout, out.stderr
