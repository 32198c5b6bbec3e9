"""The rollout scenario of ``jobs.chaos``: index updates published while the app answers, two
publishers racing, and the alias rolled back within ``index.retire_after_s`` — under load.

* :func:`make_updates`: updates of the served build, each deleting a document of a unit some question
  ranks first (so their answers differ), written by ``python -m jobs.update --no-publish`` as an
  operator runs it;
* :func:`single_index_references`: each build's exact top-k for every question from one in-process
  index over all its shards (:class:`actors.inprocess_index.InProcessIndex`), the question encoded
  by the core's embedder: what the served app must answer, whichever build answers a request;
* :func:`rollout`: the updates' publishes race from the served build (exactly one may win), the app
  follows the winner, the alias is rolled back to the first build at once, then the job waits past
  the retirement's deadline and reads Serve's applications (:class:`lab.chaos.Rollout`).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from lab.chaos import ChaosPlan, Outcome, References, Rollout


def make_updates(build_uri: str, work: Path, unit_ids: list[str], timeout_s: float = 600.0) -> list[str]:
    """One update of the build at ``build_uri`` per unit of ``unit_ids``, each without that unit's first
    document (the units a question ranks first: its answers change), written to ``work/update-<i>`` by
    ``jobs.update``; their URIs."""
    from longrag.index.artifacts import ArtifactStore, load_shard_units

    store = ArtifactStore.open(build_uri)
    manifest = store.read_manifest()
    first_doc = {u.unit_id: u.doc_ids[0] for s in manifest.shard_ids for u in load_shard_units(store, s)}
    base: list[str] = []
    if manifest.corpus is not None and manifest.corpus.sources:  # a jobs.index build holds no documents.parquet
        c = manifest.corpus
        base = ["--base-source", c.sources[0], "--base-format", c.fmt, "--text-mode", c.text_mode]
    out = []
    for i, unit_id in enumerate(unit_ids):
        delete, dest = work / f"delete-{i}.txt", work / f"update-{i}"
        delete.write_text(first_doc[unit_id] + "\n", encoding="utf-8")
        proc = subprocess.run([sys.executable, "-m", "jobs.update", "--build", build_uri, "--delete", str(delete),
                               "--out", str(dest), "--no-publish", *base],
                              capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"jobs.update for the rollout failed ({proc.returncode}): {proc.stderr[-1500:]}")
        out.append(str(dest))
    return out


def single_index_references(builds: list[str], plan: ChaosPlan) -> References:
    """Every build's exact top-``plan.k`` for each question, from one index over all its shards."""
    from actors.inprocess_index import InProcessIndex
    from longrag.config import LongRAGConfig
    from longrag.index.artifacts import ArtifactStore
    from longrag.index.embedding import Embedder

    refs: References = {}
    embedder = None
    for uri in builds:
        manifest = ArtifactStore.open(uri).read_manifest()
        config = LongRAGConfig.model_validate(manifest.config)
        embedder = embedder or Embedder(config.embedding)
        index = InProcessIndex(uri, config.index)
        topk = {}
        for q in plan.questions:  # one at a time, as the app encodes a lone question
            res = index.search_sync(embedder.encode_queries([q]), plan.k)
            topk[q] = [(h.unit_id, h.shard, h.score) for h in res.hits[0]]
        refs[manifest.build_id] = topk
    return refs


async def _answered_by(client: httpx.AsyncClient, plan: ChaosPlan, build: str, timeout_s: float) -> float | None:
    """Seconds until a retrieve is answered by ``build`` (polled every 0.25 s); None past ``timeout_s``."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        try:
            r = await client.post("/v1/retrieve", json={"question": plan.questions[0], "k": plan.k})
            if Outcome.of(r, 0.0).build_id == build:
                return round(time.perf_counter() - t0, 1)
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.25)
    return None


async def rollout(client: httpx.AsyncClient, plan: ChaosPlan, alias: str, parent: tuple[str, str],
                  updates: dict[str, str], ref: References, apps: Callable[[], set[str]],
                  app_of: Callable[[str], str]) -> Rollout:
    """``parent``/``updates``: (build id, uri) of the served build / build id -> uri of each update;
    ``ref``: every build's exact top-k; ``apps()``: Serve's application names now; ``app_of(build_id)``:
    a build's index application. The app's ``index.retire_after_s`` is ``plan.retire_after_s``."""
    from longrag.index.alias import AliasConflict, publish

    parent_id, parent_uri = parent
    retire_after_s, timeout_s = plan.retire_after_s, plan.recovery_timeout_s
    ro = Rollout(parent=parent_id)
    gate = threading.Barrier(len(updates))

    def publish_one(uri: str) -> str:
        gate.wait(timeout=30)  # both publishers read the pointer and swap it at the same moment
        try:
            publish(alias, uri, expect_build_id=parent_id)
            return "published"
        except AliasConflict as exc:
            return f"AliasConflict: {exc}"

    try:
        t0 = time.perf_counter()
        outcomes = await asyncio.gather(*(asyncio.to_thread(publish_one, uri) for uri in updates.values()))
        ro.race = dict(zip(updates, outcomes))
        won = [b for b, o in ro.race.items() if o == "published"]
        if len(won) != 1:
            raise RuntimeError(f"{len(won)} of the racing publishes won")
        ro.winner = won[0]
        ro.differing = sum(ref[parent_id][q] != ref[ro.winner][q] for q in plan.questions)
        if await _answered_by(client, plan, ro.winner, timeout_s) is None:
            raise RuntimeError(f"the app did not switch to {ro.winner} in {timeout_s:g} s")
        ro.switch_s = round(time.perf_counter() - t0, 1)
        t_switch = time.perf_counter()  # the parent's retirement ends retire_after_s after this, at the latest
        await asyncio.sleep(plan.rollout_dwell_s)  # the load meets the update, whatever the machine's speed
        t_rollback = time.perf_counter()
        publish(alias, parent_uri, expect_build_id=ro.winner)  # well within retire_after_s
        ro.rollback_s = await _answered_by(client, plan, parent_id, timeout_s)
        if ro.rollback_s is None:
            raise RuntimeError(f"the app did not return to {parent_id} in {timeout_s:g} s")
        await asyncio.sleep(max(0.0, t_switch + retire_after_s + 5.0 - time.perf_counter()))
        names = await asyncio.to_thread(apps)
        ro.parent_kept = app_of(parent_id) in names
        ro.loser_app = any(app_of(b) in names for b in updates if b != ro.winner)
        deadline = t_rollback + retire_after_s + timeout_s
        while time.perf_counter() < deadline:
            if app_of(ro.winner) not in await asyncio.to_thread(apps):
                ro.winner_deleted_s = round(time.perf_counter() - t_rollback, 1)
                break
            await asyncio.sleep(1.0)
    except Exception as exc:  # reported in the scenario, the load stops
        ro.error = f"{type(exc).__name__}: {exc}"[:500]
    return ro
