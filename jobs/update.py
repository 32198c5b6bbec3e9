"""Update a built index incrementally: new, changed and deleted documents -> a new build version
beside the old one, then an atomic switch of what the Serve app serves.

    python -m jobs.update --build artifacts/live --add changes.jsonl --delete removed.txt

``--build`` is a build or a build alias (a location whose ``current.json`` names the build served,
:mod:`longrag.index.alias`). Only the documents whose grouping can change are regrouped, only new
and changed units are embedded, and shards none of whose units changed are copied (sha256-checked)
(:mod:`longrag.index.update`). The new build goes to ``--out`` (default for an alias:
``<alias>/builds/<build id>``); its manifest names its parent. With an alias (or ``--publish``) the
alias is switched to the new build once it is complete; Retrievers serving the alias load the new
shards, switch, and release the old ones (``index.refresh_s``).

A build made by ``jobs.index`` does not hold its documents yet: the first update reads them from the
source it was built from (``--base-source``/``--base-format``, and ``--text-mode`` as built); every
updated build stores its documents (``documents.parquet``), so later updates need no source.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from longrag.cli import job_setup

log = logging.getLogger("jobs.update")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobs.update", description=__doc__.split("\n\n")[0])
    p.add_argument("--build", required=True, help="the build to update, or a build alias (local or s3://)")
    p.add_argument("--add", help="new and changed documents (JSONL, parquet or wiki XML); a doc_id the build "
                   "holds replaces that document")
    p.add_argument("--format", choices=["jsonl", "parquet", "wikixml"], help="format of --add (default: from its name)")
    p.add_argument("--delete", help="a text file of doc_ids to delete, one per line")
    p.add_argument("--out", help="where to write the new build (default with an alias: <alias>/builds/<build id>)")
    p.add_argument("--publish", help="switch this alias to the new build (default: --build when it is an alias)")
    p.add_argument("--no-publish", action="store_true", help="write the new build without switching any alias")
    p.add_argument("--base-source", help="the corpus the parent was built from, when it holds no documents.parquet")
    p.add_argument("--base-format", choices=["jsonl", "parquet", "wikixml"])
    p.add_argument("--text-mode", choices=["full", "lead"], default=None,
                   help="wiki XML text mode (default: the parent's units.text_mode)")
    args = p.parse_args(argv)
    if not args.add and not args.delete:
        p.error("nothing to update: give --add and/or --delete")
    return args


def main(argv: list[str] | None = None) -> int:
    job_setup()
    args = parse_args(argv)
    from longrag.config import LongRAGConfig
    from longrag.corpus.documents import guess_format
    from longrag.corpus.documents import read_documents as read_source
    from longrag.index.alias import AliasError, build_location, publish, resolve_build
    from longrag.index.artifacts import ArtifactStore, read_documents
    from longrag.index.embedding import Embedder, tokenizer_dir
    from longrag.index.manifest import new_build_id
    from longrag.index.plan import BuildExistsError, check_out, chunk_limits
    from longrag.index.update import Changes, UpdateError, corpus_order, plan_update, read_delete_ids, write_update
    from longrag.store import open_source
    from longrag.text.tokens import counter_for_model_dir

    try:
        parent_uri, pointer = resolve_build(args.build)
        parent = ArtifactStore.open(parent_uri)
        pm = parent.read_manifest()
        config = LongRAGConfig.model_validate(pm.config)
        text_mode = args.text_mode or config.units.text_mode
        docs = read_documents(parent)
        if docs is None:
            if not args.base_source:
                raise UpdateError(f"build {pm.build_id} holds no documents.parquet (built by jobs.index): give the "
                                  "corpus it was built from with --base-source and --base-format")
            fmt = args.base_format or guess_format(args.base_source)
            docs, report = read_source(args.base_source, fmt, text_mode=text_mode if fmt == "wikixml" else "full")
            docs = corpus_order(docs, fmt)
            log.info("read %d parent documents from %s (%d bad)", len(docs), args.base_source, report.n_bad)
        upserts = []
        if args.add:
            fmt = args.format or guess_format(args.add)
            upserts, report = read_source(args.add, fmt, text_mode=text_mode if fmt == "wikixml" else "full")
            if report.n_bad:
                log.warning("%d bad records in %s were skipped: %s", report.n_bad, args.add,
                            report.to_dict().get("bad"))
            upserts = corpus_order(upserts, fmt)
        deletes = []
        if args.delete:
            with open_source(args.delete) as fh:
                deletes = read_delete_ids(fh.read().decode("utf-8"))
        alias = None if args.no_publish else (args.publish or (args.build if pointer is not None else None))
        build_id = new_build_id()
        out = args.out or (build_location(alias, build_id) if alias else None)
        if out is None:
            raise UpdateError("--out is needed when --build is a build rather than an alias (or give --publish ALIAS)")
        check_out(out, overwrite=False)
        counter = counter_for_model_dir(tokenizer_dir(config.embedding.model))
        u = config.units
        plan = plan_update(docs, _parent_units(parent), Changes(upserts=upserts, deletes=deletes), kind=u.kind,
                           counter=counter, budget=u.max_group_tokens, passage_words=u.passage_words,
                           symmetric=u.symmetric_links, links=u.links)
        embedder = Embedder(config.embedding) if plan.new_unit_ids or plan.rebuild else None
        manifest = write_update(parent, ArtifactStore.open(out), plan, build_id=build_id,
                                embed=lambda texts: embedder.encode_passages(texts), counter=counter,
                                max_tokens=chunk_limits(config)[1],
                                command=["python", "-m", "jobs.update", *(argv if argv is not None else sys.argv[1:])])
        published = publish(alias, out, expect_build_id=pm.build_id) if alias else None
    except (UpdateError, AliasError, BuildExistsError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    result = {"build_id": manifest.build_id, "out": out, "parent": manifest.parent.model_dump(),
              "published": published.model_dump() if published else None, "stats": plan.stats}
    print(json.dumps(result, indent=2))
    return 0


def _parent_units(parent) -> dict:
    from longrag.index.artifacts import load_shard_units

    return {s: load_shard_units(parent, s) for s in parent.read_manifest().shard_ids}


if __name__ == "__main__":
    sys.exit(main())
