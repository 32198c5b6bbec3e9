"""Prompts of the long reader (LongRAG, Jiang et al. 2024, Section 3.2 and Appendix 6.1), in our words.

Turn 1 shows the retrieved units (each as ``Title: ...`` then its text) and asks for a short
paragraph that answers the question (the *long answer*). The short answer comes one of two ways
(``reader.answer``):

* ``direct`` (the default): a message over the same documents that asks for the answer alone
  (:func:`direct_messages`); it shares turn 1's system message and documents, so a backend with a
  prefix cache evaluates the documents once;
* ``two_turn`` (the paper's): turn 2 continues the turn-1 conversation and asks for the *short*
  answer only (an entity, a date, a number, a short span), calibrated with a few worked examples.
  The examples are written for this project; none come from an evaluation set.

Small models drift, so every prompt restates the question right before the model has to answer
and ends with the exact cue (``Short answer:``) whose continuation we parse.
"""

from __future__ import annotations

from dataclasses import dataclass

from longrag.types import Unit

READER_SYSTEM = "You answer questions using the documents you are given. You answer briefly and directly."

# Documents first, then the question and the instruction: the long answer's and the direct answer's
# prompts (and the reader benchmark's bare prompt) share the system message and the documents, so a
# backend with a prefix cache evaluates the documents once per question.
TURN1_TEMPLATE = """Documents:

{context}

Question: {question}

Using the documents, answer the question "{question}" in one to three sentences. Say the answer explicitly (the name, date, number or phrase the question asks for)."""

# The bare prompt's words (the baseline of ``jobs.bench reader``): listing the kinds of answer ("a
# name, a date, ... or yes or no") made the 0.5B reply "Yes" to 13 of 16 HotpotQA questions.
DIRECT_TEMPLATE = """Documents:

{context}

Question: {question}
Reply with only the answer."""

TURN2_TEMPLATE = """Now give only the short answer to the question "{question}": the few words of your answer that answer it, usually a name, a place, a date, a number or a short phrase, or yes/no. No explanation.
{examples}
Question: {question}
Long answer: {long_answer}
Short answer:"""


@dataclass(frozen=True)
class FewShotExample:
    question: str
    long_answer: str
    short_answer: str


#: Worked examples for turn 2 (our own).
FEW_SHOT_EXAMPLES: tuple[FewShotExample, ...] = (
    FewShotExample(
        "who wrote the novel frankenstein",
        "Frankenstein was written by the English author Mary Shelley and first published in 1818.",
        "Mary Shelley",
    ),
    FewShotExample(
        "what is the capital city of australia",
        "The capital of Australia is Canberra, picked as a compromise between Sydney and Melbourne.",
        "Canberra",
    ),
    FewShotExample(
        "when did the berlin wall come down",
        "The Berlin Wall fell on 9 November 1989, when the East German border crossings were opened.",
        "9 November 1989",
    ),
    FewShotExample(
        "how many players does a basketball team have on the court",
        "A basketball team plays with five players on the court at any time.",
        "five",
    ),
    FewShotExample(
        "which river flows through cairo",
        "Cairo lies on the Nile, the river that runs north through Egypt to the Mediterranean Sea.",
        "the Nile",
    ),
    FewShotExample(
        "what element has the chemical symbol fe",
        "Fe is the symbol of iron; it comes from the Latin word ferrum.",
        "iron",
    ),
    FewShotExample(
        "the director of jaws was born in which us state",
        "Jaws was directed by Steven Spielberg, who was born in Cincinnati, Ohio.",
        "Ohio",
    ),
    FewShotExample(
        "are the beatles and the rolling stones both from england",
        "Yes. The Beatles formed in Liverpool and the Rolling Stones in London, both cities in England.",
        "yes",
    ),
)


def format_unit(unit: Unit) -> str:
    """One unit as the reader sees it: a title line, then the text."""
    titles = "; ".join(t for t in unit.titles if t) or unit.unit_id
    return f"Title: {titles}\n{unit.text.strip()}"


UNIT_SEPARATOR = "\n\n"


def format_context(blocks: list[str]) -> str:
    if not blocks:
        return "(no documents were found)"
    return UNIT_SEPARATOR.join(blocks)


DOCUMENTS_HEADER = "Documents:\n\n"


def documents_head(blocks: list[str]) -> str | None:
    """The opening that the reader's user messages (turn 1, the direct answer) share up to the end
    of the top unit: the text whose KV state a backend may keep for the next question with the same
    top unit (``cache_prefix``, :mod:`longrag.llm.kvcache`). None without units."""
    return DOCUMENTS_HEADER + blocks[0] if blocks else None


def format_examples(n: int) -> str:
    """The first ``n`` few-shot examples as text (empty for n=0)."""
    if n < 0:
        raise ValueError(f"number of examples must be >= 0, got {n}")
    parts = [
        f"\nQuestion: {ex.question}\nLong answer: {ex.long_answer}\nShort answer: {ex.short_answer}"
        for ex in FEW_SHOT_EXAMPLES[:n]
    ]
    return ("\nExamples:\n" + "\n".join(parts) + "\n") if parts else ""


def turn1_messages(question: str, context: str) -> list[dict]:
    """System + user message of turn 1 (context already formatted)."""
    return [
        {"role": "system", "content": READER_SYSTEM},
        {"role": "user", "content": TURN1_TEMPLATE.format(question=question, context=context)},
    ]


def direct_messages(question: str, context: str) -> list[dict]:
    """System + user message that asks for the short answer straight from the documents (``reader.answer
    = direct``); the same system message and opening as :func:`turn1_messages`."""
    return [
        {"role": "system", "content": READER_SYSTEM},
        {"role": "user", "content": DIRECT_TEMPLATE.format(question=question, context=context)},
    ]


def turn2_message(question: str, long_answer: str, n_examples: int) -> dict:
    """The user message of turn 2, sent after turn 1 and the model's reply."""
    return {
        "role": "user",
        "content": TURN2_TEMPLATE.format(
            examples=format_examples(n_examples), question=question, long_answer=long_answer.strip()
        ),
    }


def completion_prompt(messages: list[dict], answer_cue: str = "Answer:") -> str:
    """Flatten a conversation into one plain prompt for base models (no chat template).

    User turns are followed by ``answer_cue`` unless they already end with a cue (a colon);
    assistant turns are appended as the continuation the model gave.
    """
    out: list[str] = []
    for m in messages:
        content = m["content"].strip()
        if m["role"] == "assistant":
            out.append(" " + content + "\n\n")
        elif m["role"] == "system":
            out.append(content + "\n\n")
        else:
            out.append(content if content.endswith(":") else content + "\n" + answer_cue)
    return "".join(out)
