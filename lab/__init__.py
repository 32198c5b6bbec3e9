"""The lab: benchmarks, load generators, fault injection and the autoscaling scenario, beside the
runtime as vLLM keeps ``benchmarks/`` beside its engine. The ``jobs`` and the tests import it; the
runtime (``longrag/``, ``actors/``, ``serve/``, ``cluster/``) never does (``tests/longrag/test_layout.py``).

* :mod:`lab.bench`: load generation and latency statistics, memory sampling, the serving and scale
  benchmarks' runs and tables;
* :mod:`lab.chaos` (faults injected into a running app), :mod:`lab.autoscale` (the burst and the
  timeline of the autoscaling scenario);
* :mod:`lab.tradeoff` (FAISS index kinds: recall vs speed vs memory), :mod:`lab.synthetic`
  (BABILong, RULER, HashHop style tasks; synthetic vectors and builds: :mod:`lab.synthetic.vectors`);
* :mod:`lab.reader_bench`, :mod:`lab.document_bench`, :mod:`lab.reader_report` (the reader vs a
  bare prompt), :mod:`lab.dual_bench`, :mod:`lab.dual_report` (the dual-perspective strategies).
"""
