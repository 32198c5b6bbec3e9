"""The demo's terminal carries only its transcript: Python prints, logging, warnings and C-level
writes to stdout/stderr (what Ray, Serve and forwarded worker output use) land in the log file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_transcript_routes_everything_else_to_the_log(tmp_path):
    log = tmp_path / "logs" / "demo.log"
    script = textwrap.dedent(f"""
        import logging, os, sys, warnings
        from longrag.cli import transcript
        logging.basicConfig(level=logging.INFO)
        print("before")
        with transcript({str(log)!r}) as term:
            print("Q: who?", file=term, flush=True)
            print("(ServeReplica pid=1) INFO -- CALL chat OK 4183.3ms")  # what Ray forwards to stdout
            print("raylet noise", file=sys.stderr)
            logging.getLogger("ray.serve").info("Started Serve")
            warnings.warn("a library warning")
            os.write(1, b"C-level stdout\\n")
            os.write(2, b"[core_worker.cc:2465] C-level stderr\\n")
            print("A: Orwell", file=term, flush=True)
        print("after")
        print("err after", file=sys.stderr)
    """)
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["before", "Q: who?", "A: Orwell", "after"]
    assert r.stderr.strip() == "err after"
    text = log.read_text()
    for line in ("CALL chat OK", "raylet noise", "Started Serve", "a library warning", "C-level stdout",
                 "C-level stderr"):
        assert line in text, line
    assert "Q: who?" not in text and "after" not in text
