"""A model's short-answer reply -> the answer: one set of rules for every reader of the product.

The LongReader's short answer (direct or two-turn), the long-context reader's answer to a question
(``longrag.reading.longcontext``) and the reader benchmark's attribution all finish replies here:
:func:`clean_short_answer` (first line, "Answer:"-style prefixes, quotes, a trailing period),
:func:`reduce_to_span` (a sentence cut to its answer span), :func:`short_answer_problem` (a reply
that cannot be the answer) and :func:`yes_no_answer`. Hand-written: these are the product's own
answer rules, measured against the bare prompt (docs/evaluation.md), not a library's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from longrag.reading.prompts import FewShotExample

_PREFIX = re.compile(
    r"^\s*(?:(?:the\s+)?(?:short\s+|final\s+|long\s+)?answer(?:\s+is\s*:?|\s*[:\-])|a\s*:|output\s*:)\s*",
    re.IGNORECASE,
)
_QUOTES = "\"'`“”‘’«»*_"
_ABBREV_END = re.compile(r"(?:\b[A-Za-z]\.){2,}$|\b(?:Jr|Sr|Inc|Ltd|Co|St|Dr|Mr|Mrs|Ms|etc)\.$")


def clean_short_answer(raw: str) -> str:
    """Reduce a model's short-answer reply to the answer span.

    Takes the first non-empty line, strips "Answer:"-style prefixes, surrounding quotes and
    markdown emphasis, and a trailing period (kept after abbreviations like "U.S.").
    """
    lines = [ln.strip() for ln in raw.replace("\r", "\n").split("\n")]
    text = next((ln for ln in lines if ln and not _PREFIX.fullmatch(ln) and not ln.startswith("Title:")), "")
    if not text:
        # A reply like "Short answer:\nCanberra" has the answer on the next line.
        text = next((ln for ln in lines if ln), "")
    for _ in range(3):
        new = _PREFIX.sub("", text, count=1).strip()
        new = new.strip(_QUOTES).strip()
        if new == text:
            break
        text = new
    # Echoed few-shot structure: cut at a following "Question:"/"Long answer:" marker.
    text = re.split(r"\s*(?:Question|Long answer|Short answer)\s*:", text, maxsplit=1, flags=re.IGNORECASE)[0]
    text = text.strip().strip(_QUOTES).strip()
    while text.endswith((".", ",", ";", ":", "!")) and not _ABBREV_END.search(text):
        text = text[:-1].rstrip()
    return text.strip(_QUOTES).strip()


_STOPWORDS = frozenset(
    "a an the of in on at to for by with and or is are was were be been did does do what which who whom "
    "whose when where why how many much name answer question".split()
)
_COPULA = re.compile(r"\b(?:is|are|was|were)\b:?\s+", re.IGNORECASE)
_CLAUSE_END = re.compile(r",\s|;\s|\.\s|\s\((?!\d)|\s(?:because|which|who|since|as it|and it)\s", re.IGNORECASE)


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOPWORDS}


def reduce_to_span(answer: str, question: str, max_words: int = 6) -> str:
    """Cut a sentence-long "short answer" down to its answer span.

    Small models often repeat their long answer ("The national sport of Zorbland is rowing.")
    instead of extracting from it. When ``answer`` has more than ``max_words`` words this takes
    the part after an explicit ``is:``-style cue, or after the first copula whose left side
    restates the question ("The national sport of Zorbland" -> "rowing"), then keeps the first
    clause. Short answers are returned unchanged.
    """
    if len(answer.split()) <= max_words:
        return answer
    cand = answer
    m = re.search(r":\s+(\S.*)$", cand)
    if m:
        cand = m.group(1)
    q_words = _content_words(question)
    for m in _COPULA.finditer(cand):
        left = _content_words(cand[: m.start()])
        if left and len(left & q_words) >= 0.5 * len(left):
            cand = cand[m.end() :]
            break
    cand = _CLAUSE_END.split(cand + " ", maxsplit=1)[0]
    cand = clean_short_answer(cand)
    return cand or answer


_YES_NO = frozenset({"yes", "no"})


def _normalized(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def short_answer_problem(answer: str, question: str, evidence: str, examples: Sequence[FewShotExample]) -> str | None:
    """Why a short answer cannot be the answer, or None when it may be.

    * ``"empty"``: nothing left after cleaning;
    * ``"question echo"``: the reply restates the question (it ends with "?", or its words cover at
      least 3/4 of the question's content words) -- an entity named in the question, as comparison
      questions need, covers less and passes;
    * ``"few-shot example"``: the reply is one of the worked examples of the prompt rather than an
      answer from this conversation: its content words come from an example more than from the
      ``evidence`` (the long answer and the context), or it is an example's short answer that the
      evidence never mentions. "yes"/"no" are always allowed.
    """
    if not answer.strip():
        return "empty"
    norm = _normalized(answer)
    if norm in _YES_NO:
        return None
    words = _content_words(answer)
    q_words = _content_words(question)
    if answer.rstrip().endswith("?") or (q_words and words <= q_words and len(words) >= 0.75 * len(q_words)):
        return "question echo"
    evidence_norm = f" {_normalized(evidence)} "
    from_evidence = len(words & _content_words(evidence)) / len(words) if words else 0.0
    for ex in examples:
        if norm == _normalized(ex.short_answer) and f" {norm} " not in evidence_norm:
            return "few-shot example"
        if words:
            from_example = len(words & _content_words(f"{ex.question} {ex.long_answer}")) / len(words)
            if from_example >= 0.5 and from_example > from_evidence:
                return "few-shot example"
    return None


_YES_NO_QUESTION = re.compile(
    r"^\s*(?:is|are|was|were|am|do|does|did|can|could|has|have|had|will|would|should|shall|may|might|must)\b",
    re.IGNORECASE,
)
_LEADING_YES_NO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:no|not|never|neither|nor|none|different|n't)\b|n't\b", re.IGNORECASE)


def is_yes_no_question(question: str) -> bool:
    """A question answered by yes or no: it opens with an auxiliary verb ("Are both ...", "Was X
    ...") and offers no alternatives ("Is X or Y older?" asks for one of them)."""
    return bool(_YES_NO_QUESTION.match(question)) and not re.search(r"\bor\b", question, re.IGNORECASE)


def yes_no_answer(question: str, short: str, long_answer: str) -> str | None:
    """"yes"/"no" for a yes/no question: the reply's or the long answer's leading yes/no, else the
    long answer's polarity (a negation -> "no", an affirmation -> "yes"). None for other questions."""
    if not is_yes_no_question(question):
        return None
    for text in (short, long_answer):
        m = _LEADING_YES_NO.match(text)
        if m:
            return m.group(1).lower()
    if not long_answer.strip():
        return None
    return "no" if _NEGATION.search(long_answer) else "yes"


def first_sentence(text: str, max_words: int = 30) -> str:
    """The first sentence of ``text`` (for a fallback answer), at most ``max_words`` words."""
    text = " ".join(text.split())
    m = re.search(r"(?<=[a-z0-9\)\]])[.!?](?=\s|$)", text)
    sent = text[: m.start()] if m else text
    return " ".join(sent.split()[:max_words])


def finish_short_answer(raw: str, question: str, long_answer: str, context: str,
                        examples: Sequence[FewShotExample] = (), *, cut_span: bool = True) -> tuple[str, str | None]:
    """A model's short-answer reply -> (answer, why it was replaced or None).

    Cleaned (:func:`clean_short_answer`) and, with ``cut_span``, cut to its span (:func:`reduce_to_span`;
    the long-document reader leaves it out: on its bare-prompt replies it cost 1.2-1.6 F1 and
    changed no exact match, ``jobs.bench reader --document``); a reply that
    cannot be the answer (:func:`short_answer_problem`) is replaced by the long answer's first
    sentence cut to its span, when there is a long answer; a yes/no question gets yes or no
    (:func:`yes_no_answer`)."""
    answer = clean_short_answer(raw)
    if cut_span:
        answer = reduce_to_span(answer, question)
    fallback = short_answer_problem(answer, question, f"{long_answer}\n{context}", examples)
    if fallback is not None and long_answer:
        answer = reduce_to_span(clean_short_answer(first_sentence(long_answer)), question)
    else:
        fallback = None  # no long answer to fall back to: the reply stands
    yes_no = yes_no_answer(question, raw, long_answer)
    if yes_no is not None and answer.lower() != yes_no:
        answer, fallback = yes_no, fallback or "yes/no question"
    return answer, fallback
