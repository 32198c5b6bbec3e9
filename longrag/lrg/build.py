"""Building LRGinstruction: teacher requests, self-evaluation, the four data kinds, the journal
that makes a rerun resume, the JSONL outputs and the build report.

"LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context Question
Answering" (Zhao et al., 2024), Section 3.2 and Appendix C:

- long-context extractor data (C.2): the teacher writes the global information from the supporting
  paragraphs ([STEP-1]); an output under 20 tokens is discarded; the self-evaluator ([STEP-2]) keeps it
  only when the answer can be derived from it alone. The record's instruction holds all of P.
- CoT-guidance data (C.3): the teacher writes a guiding CoT from the supporting paragraphs and the
  answer; under 20 tokens is discarded; kept when the self-evaluator finds it explains the answer.
- filtering data (C.3): each paragraph of P with the question and its accepted guiding CoT; the gold
  True/False comes from the dataset's support labels; True and False balanced per question.
- task-oriented data (C.4): P, the question and its gold answer, reformatted (no teacher call).

The build runs in two passes of independent teacher calls (generate, then evaluate), handed to an
*executor* (in-process asyncio over an :class:`~longrag.llm.base.LLM` here; a Ray Data pool or
``ray.data.llm`` processor in ``jobs.lrg_instruct``). Every reply goes to ``journal.jsonl`` as it
arrives; a rerun reuses the journaled replies whose prompt is unchanged, so a crash loses at most
the calls in flight. A failed call is an ``error`` outcome in the report, never silently dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from longrag.dual.prompts import parse_judgement
from longrag.eval.datasets import LoadResult
from longrag.lrg import prompts as P
from longrag.lrg.calls import Executor, Journal, run_pass
from longrag.lrg.preprocess import TokenCounter, preprocess, question_rng
from longrag.lrg.records import (
    BuildReport,
    InstructionRecord,
    KindCounts,
    LRGConfig,
    Message,
    Outcome,
    Provenance,
    Sample,
    TeacherReply,
    TeacherRequest,
)

log = logging.getLogger(__name__)

JOURNAL = "journal.jsonl"
OUTPUT_FILES = {"train": "train.jsonl", "heldout": "heldout.jsonl"}
REJECTED = "rejected.jsonl"
REPORT = "report.json"
MAX_ERROR_EXAMPLES = 10


# ------------------------------------------------------------------------------------------ requests


def _request(sample: Sample, kind: str, step: str, user: str, max_tokens: int, json_status: bool) -> TeacherRequest:
    msgs = [{"role": "system", "content": P.TEACHER_SYSTEM}, {"role": "user", "content": user}]
    return TeacherRequest(
        id=f"{sample.sample_id}|{kind}|{step}",
        sample_id=sample.sample_id,
        kind=kind,
        step=step,
        messages=[Message(**m) for m in msgs],
        max_tokens=max_tokens,
        json_status=json_status,
        prompt_sha=P.messages_sha(msgs, max_tokens, json_status),
    )


def _supporting_content(sample: Sample) -> str:
    return "\n\n".join(p.titled() for p in sample.supporting)


def _all_content(sample: Sample) -> str:
    return "\n\n".join(p.titled() for p in sample.paragraphs)


def teacher_kinds(config: LRGConfig) -> list[str]:
    """Kinds whose gold output the teacher writes (filtering data needs the guiding CoT)."""
    out = []
    if "extractor" in config.kinds:
        out.append("extractor")
    if "cot" in config.kinds or "filter" in config.kinds:
        out.append("cot")
    return out


def plan_generation(sample: Sample, config: LRGConfig) -> list[TeacherRequest]:
    """[STEP-1] calls of one sample (Tables 16 and 17)."""
    content = _supporting_content(sample)
    reqs = []
    for kind in teacher_kinds(config):
        if kind == "extractor":
            user = P.EXTRACTOR_STEP1.format(content=content, question=sample.question)
        else:
            user = P.COT_STEP1.format(content=content, question=sample.question, answer=sample.answer)
        reqs.append(_request(sample, kind, "generate", user, config.generate_max_tokens, False))
    return reqs


def screen_output(reply: TeacherReply | None, config: LRGConfig, count_tokens: TokenCounter) -> tuple[str, str] | None:
    """Why a [STEP-1] output cannot go to the self-evaluator, as ``(status, reason)``; None if it can."""
    if reply is None:
        return "error", "no teacher reply"
    if not reply.ok:
        return "error", f"teacher call failed: {reply.error}"
    if count_tokens(reply.text.strip()) < config.min_output_tokens:
        return "rejected", f"output shorter than {config.min_output_tokens} tokens"
    return None


def plan_evaluation(
    sample: Sample, generated: dict[str, TeacherReply], config: LRGConfig, count_tokens: TokenCounter
) -> list[TeacherRequest]:
    """[STEP-2] self-evaluation calls for the sample's [STEP-1] outputs that passed the length rule."""
    reqs = []
    for kind in teacher_kinds(config):
        reply = generated.get(f"{sample.sample_id}|{kind}|generate")
        if screen_output(reply, config, count_tokens) is not None:
            continue
        template = P.EXTRACTOR_STEP2 if kind == "extractor" else P.COT_STEP2
        user = template.format(question=sample.question, output=reply.text.strip(), answer=sample.answer)
        reqs.append(_request(sample, kind, "evaluate", user, config.evaluate_max_tokens, True))
    return reqs


# ------------------------------------------------------------------------------------------ assembly


def split_of(sample_id: str, config: LRGConfig) -> str:
    """Deterministic held-out split by question (all kinds of one question share a split)."""
    if config.heldout_fraction <= 0:
        return "train"
    h = int.from_bytes(hashlib.sha256(f"split:{config.seed}:{sample_id}".encode()).digest()[:8], "big")
    return "heldout" if h / 2**64 < config.heldout_fraction else "train"


def _record(sample: Sample, kind: str, rid: str, user: str, gold: str, split: str, prov: Provenance) -> InstructionRecord:
    return InstructionRecord(
        id=rid,
        kind=kind,
        split=split,
        messages=[
            Message(role="system", content=P.SYSTEM),
            Message(role="user", content=user),
            Message(role="assistant", content=gold),
        ],
        provenance=prov,
    )


def judge(
    sample: Sample,
    kind: str,
    generated: dict[str, TeacherReply],
    evaluated: dict[str, TeacherReply],
    config: LRGConfig,
    count_tokens: TokenCounter,
) -> tuple[str | None, str | None, Outcome | None]:
    """The teacher's accepted output for ``kind`` and the verdict text, or the outcome that ends it."""
    reply = generated.get(f"{sample.sample_id}|{kind}|generate")
    screened = screen_output(reply, config, count_tokens)
    if screened is not None:
        return None, None, Outcome(sample_id=sample.sample_id, kind=kind, status=screened[0], reason=screened[1])
    verdict = evaluated.get(f"{sample.sample_id}|{kind}|evaluate")
    if verdict is None or not verdict.ok:
        why = "no self-evaluation reply" if verdict is None else f"self-evaluation call failed: {verdict.error}"
        return None, None, Outcome(sample_id=sample.sample_id, kind=kind, status="error", reason=why)
    status = parse_judgement(verdict.text)
    if status is None:
        return None, None, Outcome(sample_id=sample.sample_id, kind=kind, status="rejected",
                                   reason="self-evaluation reply unparseable")  # fmt: skip
    if not status:
        return None, None, Outcome(sample_id=sample.sample_id, kind=kind, status="rejected",
                                   reason="self-evaluation: false")  # fmt: skip
    return reply.text.strip(), verdict.text.strip(), None


def assemble(
    sample: Sample,
    generated: dict[str, TeacherReply],
    evaluated: dict[str, TeacherReply],
    config: LRGConfig,
    teacher: str,
    count_tokens: TokenCounter,
) -> tuple[list[InstructionRecord], list[Outcome], Counter]:
    """A sample's records and the outcomes of its rejected/failed candidates; also the candidate
    counts per kind."""
    split = split_of(sample.sample_id, config)
    titles = [p.title for p in sample.paragraphs]
    records: list[InstructionRecord] = []
    outcomes: list[Outcome] = []
    candidates: Counter = Counter()
    content = _all_content(sample)

    def prov(teacher_name: str | None, verdict: str | None = None, para_titles: list[str] | None = None) -> Provenance:
        return Provenance(teacher=teacher_name, prompts_sha=P.PROMPTS_SHA, source=sample.source,
                          question_id=sample.qid, paragraph_titles=para_titles or titles,
                          self_evaluation=verdict)  # fmt: skip

    accepted: dict[str, tuple[str, str]] = {}
    failed: dict[str, Outcome] = {}
    for kind in teacher_kinds(config):
        out, verdict, bad = judge(sample, kind, generated, evaluated, config, count_tokens)
        if bad is not None:
            failed[kind] = bad
        else:
            accepted[kind] = (out, verdict)

    for kind, template in (("extractor", P.EXTRACTOR_PROMPT), ("cot", P.COT_PROMPT)):
        if kind not in config.kinds:
            continue
        candidates[kind] += 1
        if kind in failed:
            outcomes.append(failed[kind])
            continue
        out, verdict = accepted[kind]
        user = template.format(content=content, question=sample.question)
        records.append(_record(sample, kind, f"{sample.sample_id}|{kind}", user, out, split, prov(teacher, verdict)))

    if "filter" in config.kinds:
        trues = [(i, p) for i, p in enumerate(sample.paragraphs) if p.supporting]
        falses = [(i, p) for i, p in enumerate(sample.paragraphs) if not p.supporting]
        chosen = trues + falses
        if config.balance_filter:
            k = min(len(trues), len(falses))
            rng = question_rng(config.seed, "filter:" + sample.sample_id)
            chosen = sorted(rng.sample(trues, k) + rng.sample(falses, k))
        n_extra = len(sample.paragraphs) - len(chosen)
        candidates["filter"] += len(sample.paragraphs)
        if n_extra:
            outcomes += [Outcome(sample_id=sample.sample_id, kind="filter", status="rejected",
                                 reason="True/False balance")] * n_extra  # fmt: skip
        if "cot" in failed:
            bad = failed["cot"]
            reason = f"no accepted guiding CoT ({bad.reason})" if bad.status == "rejected" else bad.reason
            outcomes += [Outcome(sample_id=sample.sample_id, kind="filter", status=bad.status, reason=reason)] * len(chosen)
        else:
            cot, verdict = accepted["cot"]
            for i, p in chosen:
                user = P.JUDGE_PROMPT.format(content=p.titled(), question=sample.question, cot=cot)
                gold = json.dumps({"status": p.supporting})
                records.append(_record(sample, "filter", f"{sample.sample_id}|filter|{i}", user, gold, split,
                                       prov(teacher, verdict, [p.title])))  # fmt: skip

    if "task" in config.kinds:
        candidates["task"] += 1
        user = P.GENERATOR_PROMPT.format(content=content, question=sample.question)
        records.append(_record(sample, "task", f"{sample.sample_id}|task", user, sample.answer, split, prov(None)))
    return records, outcomes, candidates


# ------------------------------------------------------------------------------------------ build


@dataclass
class Input:
    """One loaded QA file and how many of its kept questions to use."""

    loaded: LoadResult
    limit: int | None = None


def _source_names(inputs: Sequence[Input]) -> list[str]:
    names, seen = [], Counter()
    for inp in inputs:
        base = Path(inp.loaded.source).name
        for suffix in (".gz", ".bz2", ".jsonl", ".json"):
            base = base.removesuffix(suffix)
        seen[base] += 1
        names.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return names


def _write_jsonl_atomic(path: Path, rows: Iterable[str]) -> int:
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(row + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def llama_factory_info(out_dir: Path) -> dict:
    """A LLaMA-Factory ``dataset_info.json`` for the two splits (sharegpt format, OpenAI-style tags)."""
    spec = {
        "formatting": "sharegpt",
        "columns": {"messages": "messages"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                 "assistant_tag": "assistant", "system_tag": "system"},  # fmt: skip
    }
    return {f"lrginstruction_{split}": {"file_name": name, **spec} for split, name in OUTPUT_FILES.items()}


def build_lrg(
    inputs: Sequence[Input],
    out_dir: str | Path,
    config: LRGConfig,
    executor: Executor,
    *,
    teacher: str,
    count_tokens: TokenCounter,
) -> BuildReport:
    """Pre-process ``inputs``, run both teacher passes through ``executor`` (resuming from the
    journal in ``out_dir``), and write ``train.jsonl``, ``heldout.jsonl``, ``rejected.jsonl``,
    ``dataset_info.json`` and ``report.json`` there."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    samples: list[Sample] = []
    dropped: Counter = Counter()
    sources = []
    for inp, name in zip(inputs, _source_names(inputs)):
        lr = inp.loaded
        got, why = preprocess(lr.examples, lr.format, name, config, count_tokens, inp.limit)
        samples += got
        dropped.update(why)
        if lr.n_malformed:
            dropped["malformed record"] += lr.n_malformed
        sources.append({**lr.summary(), "name": name, "kept": len(got), "dropped": dict(why)})

    journal = Journal(out / JOURNAL)
    gen_reqs = [r for s in samples for r in plan_generation(s, config)]
    generated, reused_g, errors_g = run_pass(gen_reqs, journal, executor)
    eval_reqs = [r for s in samples for r in plan_evaluation(s, generated, config, count_tokens)]
    evaluated, reused_e, errors_e = run_pass(eval_reqs, journal, executor)

    records: list[InstructionRecord] = []
    outcomes: list[Outcome] = []
    kinds = {k: KindCounts() for k in config.kinds}
    for s in samples:
        recs, outs, cands = assemble(s, generated, evaluated, config, teacher, count_tokens)
        records += recs
        outcomes += outs
        for k, n in cands.items():
            kinds[k].candidates += n
        for r in recs:
            kinds[r.kind].kept += 1
        for o in outs:
            if o.status == "error":
                kinds[o.kind].errors += 1
            else:
                kinds[o.kind].rejected[o.reason] = kinds[o.kind].rejected.get(o.reason, 0) + 1

    counts = {}
    for split, name in OUTPUT_FILES.items():
        rows = (r.model_dump_json() for r in records if r.split == split)
        counts[split] = _write_jsonl_atomic(out / name, rows)
    _write_jsonl_atomic(out / REJECTED, (o.model_dump_json() for o in outcomes))
    (out / "dataset_info.json").write_text(json.dumps(llama_factory_info(out), indent=2))

    judged = [kinds[k] for k in ("extractor", "cot") if k in kinds]
    cand = sum(k.candidates for k in judged)
    errors = errors_g + errors_e
    report = BuildReport(
        teacher=teacher,
        prompts_sha=P.PROMPTS_SHA,
        config=config,
        sources=sources,
        questions_loaded=sum(len(i.loaded.examples) for i in inputs),
        questions_dropped=dict(dropped),
        questions_kept=len(samples),
        paragraphs={
            "supporting": sum(len(s.supporting) for s in samples),
            "distracting": sum(len(s.distracting) for s in samples),
        },
        teacher_requests=len(gen_reqs) + len(eval_reqs),
        teacher_replies_reused=reused_g + reused_e,
        teacher_errors=len(errors),
        teacher_error_examples=[f"{e.id}: {e.error}" for e in errors[:MAX_ERROR_EXAMPLES]],
        kinds=kinds,
        records=counts,
        kept_ratio=round(sum(k.kept for k in judged) / cand, 4) if cand else None,
        wall_s=round(time.perf_counter() - t0, 2),
    )
    (out / REPORT).write_text(report.model_dump_json(indent=2))
    if journal.bad_lines:
        log.warning("%s: %d torn journal line(s) ignored", out / JOURNAL, journal.bad_lines)
    return report


def read_records(path: str | Path) -> list[InstructionRecord]:
    """The records of one output JSONL file."""
    with open(path, encoding="utf-8") as fh:
        return [InstructionRecord.model_validate_json(line) for line in fh if line.strip()]
