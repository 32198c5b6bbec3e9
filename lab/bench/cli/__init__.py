"""The benchmarks, one module each, that ``longrag bench <name>`` (``python -m jobs.bench <name>``) runs:
each one's options and ``main(argv)``, its measuring logic beside it or in ``lab.bench``. The ones that
need a cluster import Ray inside the function that starts it, so importing any of them needs no Ray."""
