"""Stage 3, reading: retrieved long units -> answers.

:mod:`~longrag.reading.reader` (the two-turn long reader with context fitting and the short-answer guard),
:mod:`~longrag.reading.prompts` (reader prompts and few-shot examples),
:mod:`~longrag.reading.longcontext` (one long document + question through MixPR compression).
"""
