# Tandem: `make run` sets everything up and serves the default model pair (OpenAI-compatible API and
# dashboard); `make test` runs the test suite.
# Models and caches live under $TANDEM_HOME (default ~/.cache/tandem), the venv in .venv; neither is in git.

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# llama.cpp built for this CPU's vector units (AVX2, and AVX-512 and AMX where present), never
# -march=native (scripts/llama-cmake-args.py: with AMX under GCC 12 it adds the flag without which
# the tile kernels die on SIGILL). A venv built on another CPU is rebuilt when the flags differ.
# `make install LLAMA_CMAKE_ARGS="$$(scripts/llama-cmake-args.py --generic)"`: an AVX2 build for any x86-64.
LLAMA_CMAKE_ARGS ?= $(shell $(PYTHON) scripts/llama-cmake-args.py)
LLAMA_VERSION := 0.3.36
# the bindings' text-only parts: no multimodal library (libmtmd, unused here; 386 s against 495 s to build, AMD EPYC Zen 3)
LLAMA_PARTS := -DLLAVA_BUILD=OFF
HOST ?= 127.0.0.1
PORT ?= 8000
# tests/fast in this many processes, one thread each (2 cores: 2 min 20 s against 4 min 8 s in one, AMD EPYC Zen 3)
FAST_TEST_WORKERS ?= 2
FAST_TESTS = OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/fast -q -n $(FAST_TEST_WORKERS)
PROMPT ?= [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome, with a docstring and two examples."}]

.PHONY: install llama-build models system-deps run generate test test-fast test-real bench bench-serve clean

install: $(VENV)/.installed llama-build

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0   # the CPU build; an unpinned torch pulls CUDA packages
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $(LLAMA_PARTS)" $(BIN)/pip install -q --no-cache-dir llama-cpp-python==$(LLAMA_VERSION)  # from source (~6 min)
	echo "$(LLAMA_CMAKE_ARGS)" > $(VENV)/.llama-cmake-args
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# llama-cpp-python again (~5 min) when the venv's build was made with other CPU flags than this CPU's
llama-build: $(VENV)/.installed
	@if [ "$$(cat $(VENV)/.llama-cmake-args 2>/dev/null)" != "$(LLAMA_CMAKE_ARGS)" ]; then \
	  echo "rebuilding llama-cpp-python for this CPU (~5 min): $(LLAMA_CMAKE_ARGS)"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $(LLAMA_PARTS)" $(BIN)/pip install -q --no-cache-dir --force-reinstall --no-deps \
	    llama-cpp-python==$(LLAMA_VERSION) && echo "$(LLAMA_CMAKE_ARGS)" > $(VENV)/.llama-cmake-args; \
	fi

models: install
	$(BIN)/tandem models pull qwen2.5-coder-1.5b-instruct
	$(BIN)/tandem models pull qwen2.5-coder-0.5b-instruct-q4_0   # pulls the shipped 0.5B, then re-quantizes it

system-deps:
	scripts/system-deps.sh   # redis-server and chromium for the cache and dashboard tests

run: models
	$(BIN)/tandem serve --host $(HOST) --port $(PORT)

generate: models
	$(BIN)/tandem generate --messages '$(PROMPT)' --max-tokens 128 --verbose

test: install system-deps
	$(BIN)/tandem models pull smollm2-135m-instruct
	$(FAST_TESTS)
	$(BIN)/python -m pytest tests/real -q

test-fast: install
	$(FAST_TESTS)

test-real: install system-deps
	$(BIN)/tandem models pull smollm2-135m-instruct
	$(BIN)/python -m pytest tests/real -q

bench: models
	$(BIN)/tandem bench --max-tokens 50 --out bench-out

bench-serve: models
	$(BIN)/tandem bench-serve --max-tokens 50 --out bench-serve-out

clean:
	rm -rf $(VENV) bench-out bench-serve-out
