"""Prompts of the LRGinstruction build.

Two families ("LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for Long-Context
Question Answering", Zhao et al., 2024, Appendix C, Tables 16-18):

- construction prompts, sent to the teacher: [STEP-1] writes the gold output (the extractor's global
  information from the supporting paragraphs; the guiding CoT from them and the answer), [STEP-2]
  is the self-evaluator that judges it (True/False as JSON);
- instruction prompts, what the student sees at training time: the very prompts the
  dual-perspective pipeline sends at inference (:mod:`longrag.dual.prompts`), so a model tuned on
  this data is tuned on its own inputs.

:data:`PROMPTS_SHA` fingerprints all of them; it is part of every record's provenance and of the
journal's prompt fingerprints.
"""

from __future__ import annotations

import hashlib
import json

from longrag.dual.prompts import (
    COT_PROMPT,
    EXTRACTOR_PROMPT,
    GENERATOR_PROMPT,
    JUDGE_PROMPT,
    JUDGEMENT_SCHEMA,
    SYSTEM,
)

__all__ = [
    "SYSTEM",
    "EXTRACTOR_STEP1",
    "EXTRACTOR_STEP2",
    "COT_STEP1",
    "COT_STEP2",
    "EXTRACTOR_PROMPT",
    "COT_PROMPT",
    "JUDGE_PROMPT",
    "GENERATOR_PROMPT",
    "STATUS_SCHEMA",
    "PROMPTS_SHA",
    "TEACHER_SYSTEM",
]

TEACHER_SYSTEM = "You are a careful annotator that builds question-answering training data from documents."

# Table 16 [STEP-1]: the supporting paragraphs are the global information to cite.
EXTRACTOR_STEP1 = (
    "{content}\n\n"
    "Based on the above background only, output the original information that needs to be cited to "
    "answer the following question. Make sure the cited information is detailed and comprehensive.\n"
    "Question: {question}\n"
    "Output only the original information of the required reference:"
)
# Table 16 [STEP-2]: can the answer be derived from the extracted information alone?
EXTRACTOR_STEP2 = (
    "I am going to give you a question, background information, and the answer to that question. "
    "Evaluate whether the answer can be derived solely from the given background information. If it "
    "can, set status to true; if it cannot, set status to false.\n"
    "Question: {question}\n"
    "Background information: {output}\n"
    "Answer: {answer}\n"
    'Reply with JSON only: {{"status": true}} or {{"status": false}}.'
)
# Table 17 [STEP-1]: a thought process from the supporting paragraphs and the known answer.
COT_STEP1 = (
    "{content}\n\n"
    "Given question: {question}\n"
    "The answer is: {answer}\n"
    "Your task is to give your thought process for this question based on the above information. "
    "Give only your thought process and do not output anything else.\n"
    "Thought process:"
)
# Table 17 [STEP-2]: does the thought process explain the answer?
COT_STEP2 = (
    "Question: {question}\n"
    "Thought process for the question: {output}\n"
    "Answer: {answer}\n"
    "Evaluate whether this thought process explains the answer to the question. If it does, set "
    "status to true; if it does not, set status to false.\n"
    'Reply with JSON only: {{"status": true}} or {{"status": false}}.'
)

STATUS_SCHEMA = JUDGEMENT_SCHEMA  # {"status": bool}: the self-evaluator's and the filter's verdict


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


PROMPTS_SHA = _sha(
    {
        "teacher_system": TEACHER_SYSTEM,
        "extractor_step1": EXTRACTOR_STEP1,
        "extractor_step2": EXTRACTOR_STEP2,
        "cot_step1": COT_STEP1,
        "cot_step2": COT_STEP2,
        "system": SYSTEM,
        "extractor": EXTRACTOR_PROMPT,
        "cot": COT_PROMPT,
        "judge": JUDGE_PROMPT,
        "generator": GENERATOR_PROMPT,
        "status_schema": STATUS_SCHEMA,
    }
)[:16]


def messages_sha(messages: list[dict], max_tokens: int, json_status: bool) -> str:
    """Fingerprint of one teacher call (what a journaled reply must match to be reused)."""
    return _sha({"m": messages, "t": max_tokens, "j": json_status})[:16]
