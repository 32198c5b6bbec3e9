"""LongRAG core library: long retrieval units, MaxP retrieval, long readers, MixPR.

This package never imports Ray. Everything here runs (and is tested) in a plain Python process;
the Ray shells in ``actors/``, ``serve/`` and ``jobs/`` own these objects and add placement,
concurrency, retries and health.
"""

__version__ = "0.1.0"
