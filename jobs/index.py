"""Build a LongRAG index: parse -> group -> chunk + embed -> shard -> manifest.

    python -m jobs.index --source data/sample/enwiki-sample-106-articles.xml.bz2 --format wikixml \\
        --out artifacts/sample --unit grouped --text-mode lead --shards 2

    ray job submit --working-dir . -- python -m jobs.index --source ... --out s3://bucket/builds/wiki

Reading, parsing, token counting and unit assembly run in Ray Data workers; the driver holds only
the documents' metadata and link graph (:mod:`actors.distbuild`), and the parsed documents are kept
as the build's ``documents/`` parquet artifact. A corpus without hyperlinks is grouped along links
computed part by part on the cluster (``--links titles|tfidf|both``, :mod:`actors.distlinks`).

The plan (units, shards, resume decision) is :mod:`longrag.index.plan`; the Ray Data execution is
:mod:`actors.build`. An existing build at ``--out`` is refused unless ``--overwrite`` is given: two
builds are never mixed. An interrupted build (status ``building``) continues with ``--resume``: a
shard already written is kept when its units and files (sha256) still match; a resume whose build
settings or units differ from the interrupted build is refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import get_args

from longrag.cli import add_cluster_flags, add_config_flags, config_from_args, job_setup, number
from longrag.config import LinkSource
from longrag.index.plan import BuildExistsError, ResumeError, check_out

log = logging.getLogger("jobs.index")

CONFIG_FLAGS = {
    "shards": "index.shards",
    "unit": "units.kind",
    "text_mode": "units.text_mode",
    "max_group_tokens": "units.max_group_tokens",
    "links": "units.links",
    "embedding_model": "embedding.model",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.index", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True, nargs="+",
                   help="one or many files or folders, local or s3://: wiki XML dumps (.xml/.xml.bz2; a "
                        "multistream dump with its index is read stream by stream), JSONL or parquet documents")
    p.add_argument("--format", choices=["wikixml", "jsonl", "parquet"], required=True)
    p.add_argument("--out", required=True, help="build directory or s3://bucket/prefix")
    p.add_argument("--shards", type=number(int, min_value=1), help="number of index shards (index.shards)")
    p.add_argument("--unit", choices=["grouped", "document", "passage"], help="retrieval unit kind (units.kind)")
    p.add_argument("--text-mode", choices=["full", "lead"], help="whole pages or lead sections (units.text_mode)")
    p.add_argument("--max-group-tokens", type=number(int, min_value=1),
                   help="token budget of a grouped unit (units.max_group_tokens)")
    p.add_argument("--links", choices=get_args(LinkSource),
                   help="what grouped units group along (units.links): the documents' hyperlinks, or, for a corpus "
                        "without them, title mentions, TF-IDF neighbours or both, computed on the cluster")
    p.add_argument("--embedding-model", help="embedding.model")
    add_config_flags(p)
    add_cluster_flags(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing build at --out")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted build at --out (same source and config): keep its verified shards")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    job_setup()
    args = parse_args(argv)
    try:
        config = config_from_args(args, CONFIG_FLAGS)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # refuse before starting anything
        check_out(args.out, args.overwrite, args.resume)
    except (BuildExistsError, ResumeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    from actors.distbuild import build_corpus_index
    from cluster.local import start_or_join

    handle = start_or_join(args.address, num_cpus=args.num_cpus)
    try:
        report = build_corpus_index(args.source, args.format, args.out, config, overwrite=args.overwrite,
                                    resume=args.resume, command=["python", "-m", "jobs.index", *(argv if argv is not None else sys.argv[1:])])
    except Exception as exc:
        log.error("index build failed: %s", exc)
        print(f"error: {exc}", file=sys.stderr)
        from longrag.index.artifacts import ArtifactStore

        try:
            if not isinstance(exc, (BuildExistsError, ResumeError)) and ArtifactStore.open(args.out).status() == "building":
                print(f"the shards written so far are kept: rerun with --resume to finish the build at {args.out}",
                      file=sys.stderr)
        except Exception:  # the store itself may be what failed
            pass
        return 1
    finally:
        handle.shutdown()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
