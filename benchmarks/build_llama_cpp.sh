#!/usr/bin/env bash
# Builds llama.cpp's native tools from the llama.cpp sources vendored in the llama-cpp-python 0.3.36
# sdist (the same llama.cpp the Python binding runs): `llama-server` (its OpenAI-compatible server,
# for `python -m benchmarks serve`), `llama-bench` and `llama-batched-bench` (for `python -m
# benchmarks decode`). Nothing of llama.cpp lands in this repository: the sdist is downloaded and
# built under $LLAMA_SERVER_DIR (default ~/.cache/anatomy/llama-server), once; ~10-15 min on 2 cores.
# Prints the folder of the binaries.
set -euo pipefail
dir=${LLAMA_SERVER_DIR:-$HOME/.cache/anatomy/llama-server}
version=0.3.36
build="$dir/build-no-amx"  # a build of its own: see the AMX note below
bin="$build/bin"
tools="llama-server llama-bench llama-batched-bench"
built=1
for tool in $tools; do [ -x "$bin/$tool" ] || built=0; done
if [ "$built" = 1 ]; then echo "$bin"; exit 0; fi
mkdir -p "$dir"
python=${PYTHON:-python3}
if [ ! -d "$dir/llama_cpp_python-$version" ]; then
    "$python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$dir" >&2
    tar xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir"
fi
src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
# Native, without ggml's AMX kernels: on this project's AMX machines (Sapphire Rapids VMs) they segfault in
# ggml_backend_amx_mul_mat on the Q4_1 file (llama-bench, llama-server; `--repack 0` avoids them at less
# than half the speed). Without AMX, llama.cpp runs its AVX-512 VNNI repacked kernels, as the prebuilt
# llama-cpp-python does. The flags follow -march=native, so they win; elsewhere they change nothing.
cpu_cmake="$src/ggml/src/ggml-cpu/CMakeLists.txt"
grep -q -- "-mno-amx-int8" "$cpu_cmake" || \
    sed -i 's/list(APPEND ARCH_FLAGS -march=native)/list(APPEND ARCH_FLAGS -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)/' "$cpu_cmake"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$build" --target $tools -j "$(nproc)" >&2
echo "$bin"
