"""Fetch the full evaluation sets (optional; the tests and the README's commands use the samples in data/).

    python -m jobs.fetch_data --list
    python -m jobs.fetch_data --dataset hotpotqa-dev --out data/full/
    python -m jobs.fetch_data --dataset hotpotqa-dev,nq-open-dev --out data/full/
    python -m jobs.fetch_data --dataset hotpotqa-dev --url https://my-mirror/hotpot_dev_distractor_v1.json \\
        --sha256 <hex> --out data/full/

A thin shell over :mod:`longrag.corpus.fetch`: downloads resume where an interrupted run stopped, and a
``--sha256`` is checked before the file is kept. Exit status 0 when every file is in place, 1 when a
download failed (the message names the URL), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys

from longrag.corpus.fetch import DATASETS, FetchError, fetch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.fetch_data", description=__doc__.split("\n")[0])
    p.add_argument("--list", action="store_true", help="list the datasets and their URLs, then exit")
    p.add_argument("--dataset", default="", help=f"comma-separated names: {', '.join(DATASETS)}")
    p.add_argument("--out", default="data/full", help="folder for the downloads (default: data/full)")
    p.add_argument("--url", help="download from this URL instead of the official one (one dataset only)")
    p.add_argument("--sha256", help="expected sha256 of the file (one dataset only)")
    p.add_argument("--timeout", type=float, default=60.0, help="network timeout in seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.list:
        return args
    names = [n.strip() for n in args.dataset.split(",") if n.strip()]
    if not names:
        p.error("--dataset is required (or --list)")
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        p.error(f"unknown dataset {', '.join(map(repr, unknown))}; expected one of {', '.join(DATASETS)}")
    if (args.url or args.sha256) and len(names) != 1:
        p.error("--url and --sha256 apply to exactly one --dataset")
    args.names = names
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for d in DATASETS.values():
            print(f"{d.name:24s} {d.licence:13s} {d.url}\n{'':24s} {d.description}")
        return 0
    failed = 0
    for name in args.names:
        try:
            res = fetch(name, args.out, url=args.url, sha256=args.sha256, timeout=args.timeout,
                        progress=not args.no_progress and sys.stderr.isatty())
        except FetchError as exc:
            print(f"{name}: FAILED: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(res.summary())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
