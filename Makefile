# Everything a fresh machine needs comes from here: Debian packages, the venv, the demo models.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CLI := $(VENV)/bin/tritonllm
MODELS ?= models
PYTEST_ARGS ?=

.PHONY: install system-deps model serve test test-slow bench lint perf-analyzer clean

install: $(VENV)/.installed

# pgrep finds the stubs a server leaves; curl runs the README examples.
system-deps:
	@command -v pgrep >/dev/null && command -v curl >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq procps curl)

$(VENV)/.installed: pyproject.toml | system-deps
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first and pinned: the CPU wheel lies on the machine, any other build pulls CUDA packages.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	touch $@

$(MODELS)/%/config.json: | install
	$(CLI) build-demo-model --out $(MODELS) --name $*

model: $(MODELS)/tiny/config.json $(MODELS)/small/config.json

serve: install $(MODELS)/small/config.json
	$(CLI) serve

test: install $(MODELS)/tiny/config.json
	$(PY) -m pytest $(PYTEST_ARGS)

test-slow: install $(MODELS)/tiny/config.json
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

# W1 side by side (transformers generate, generate_batch, decode ceiling, this engine in-process and via Triton).
bench: install model
	$(PIP) install -q -e '.[test,bench]'
	$(PY) bench/run.py

lint: install
	$(VENV)/bin/ruff check tritonllm model_repository tests client bench
	$(VENV)/bin/ruff format --check tritonllm model_repository tests client bench

perf-analyzer: install
	$(CLI) perf-analyzer --version

clean:
	rm -rf $(MODELS) build .pytest_cache
