"""The prompts of dual-perspective LongRAG and the filter's reply format: the system line, the
extractor, CoT, judgement and generator prompts (written for this project after the roles of the
paper's Table 23 prompts, and shared with the LRGinstruction data of :mod:`longrag.lrg`), the
judgement's JSON schema and the lenient parse of a judgement reply.
"""

from __future__ import annotations

import json
import re
from typing import Any

JUDGEMENT_SCHEMA: dict[str, Any] = {
    "title": "judgement",
    "type": "object",
    "properties": {"status": {"type": "boolean"}},
    "required": ["status"],
    "additionalProperties": False,
}

SYSTEM = "You are a careful assistant that answers questions from the documents you are given."
EXTRACTOR_PROMPT = (
    "Background:\n{content}\n\n"
    "Read the background above. Write down the information from it that someone would need to cite to "
    "answer the question below: the relevant facts and how they connect. Do not answer the question itself.\n"
    "Question: {question}"
)
COT_PROMPT = (
    "Passages:\n{content}\n\n"
    "Using the passages above, reason step by step about how the following question can be answered: "
    "which facts are needed and how they lead to the answer.\n"
    "Question: {question}"
)
JUDGE_PROMPT = (
    "Passage:\n{content}\n\n"
    "Question: {question}\n"
    "Reasoning about the question: {cot}\n\n"
    "Following that reasoning, decide whether the passage must be cited to answer the question. "
    'Reply with JSON only: {{"status": true}} if it must be cited, {{"status": false}} if not.'
)
GENERATOR_PROMPT = (
    "{content}\n\n"
    "Answer the question from the information above. Give only the answer, with no other words.\n"
    "Question: {question}\nAnswer:"
)
GLOBAL_HEADER = "Global information:\n"
DETAILS_HEADER = "Passages:\n"

_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_BOOL_WORD = re.compile(r"\b(true|false|yes|no)\b", re.IGNORECASE)


def parse_judgement(text: str) -> bool | None:
    """``{"status": true|false}`` (also "True"/"yes" strings, extra text around the object) -> bool;
    a bare true/false/yes/no word is accepted as a fallback; anything else -> None."""
    for m in _JSON_OBJECT.finditer(text or ""):
        try:
            obj = json.loads(m.group(0))
        except ValueError:
            obj = None
        if isinstance(obj, dict) and "status" in obj:
            v = obj["status"]
            if isinstance(v, bool):
                return v
            if isinstance(v, str) and v.strip().lower() in ("true", "false", "yes", "no"):
                return v.strip().lower() in ("true", "yes")
            return None
    m = _BOOL_WORD.search(text or "")
    if m:
        return m.group(1).lower() in ("true", "yes")
    return None
