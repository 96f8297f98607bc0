#!/usr/bin/env bash
# Builds llama.cpp's native tools from the llama.cpp sources vendored in the llama-cpp-python 0.3.36
# sdist (the same llama.cpp the Python binding runs): `llama-server` (for `python -m benchmarks serve`),
# `llama-bench` and `llama-batched-bench` (`python -m benchmarks decode`), `llama-perplexity` and
# `llama-quantize` (`python -m benchmarks quality`, the files people download). Nothing of llama.cpp
# lands in this repository: the sdist is downloaded and built under $LLAMA_SERVER_DIR (default
# ~/.cache/anatomy/llama-server); ~10-15 min on 2 cores. Prints the folder of the binaries.
#
# The build is made for this CPU (-march=native) and stamped with the CPU it was made for
# (build-info.txt): a build made on a CPU with other flags is made again, never reused.
#     build_llama_cpp.sh --check    prints "current" or "stale: ..." and builds nothing (exit 0 / 1)
#     build_llama_cpp.sh --sources  unpacks the sources only (the tests run llama.cpp's own converter,
#                                   convert_hf_to_gguf.py) and prints their folder
set -euo pipefail
dir=${LLAMA_SERVER_DIR:-$HOME/.cache/anatomy/llama-server}
version=0.3.36
build="$dir/build-no-amx"  # a build of its own: see the AMX note below
bin="$build/bin"
stamp="$build/build-info.txt"
tools="llama-server llama-bench llama-batched-bench llama-perplexity llama-quantize"
cmake_flags="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF"
cpu_model=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | tr ' ' '\n' | sort | tr '\n' ' ' \
    | sha256sum | cut -c1-16)
[ -n "$cpu_model" ] || cpu_model=$(uname -m)

current() {  # every tool is there, and the stamp names this CPU's flags
    for tool in $tools; do [ -x "$bin/$tool" ] || return 1; done
    [ -f "$stamp" ] && grep -qx "cpu_flags_digest: $cpu_flags" "$stamp"
}

python=${PYTHON:-python3}
sources() {  # the sdist, downloaded and unpacked once
    mkdir -p "$dir"
    if [ ! -d "$dir/llama_cpp_python-$version" ]; then
        "$python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$dir" >&2
        tar xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir"
    fi
}
if [ "${1:-}" = "--sources" ]; then
    sources
    echo "$dir/llama_cpp_python-$version/vendor/llama.cpp"
    exit 0
fi
if [ "${1:-}" = "--check" ]; then
    if current; then echo current; exit 0; fi
    built_for=$(grep -m1 '^cpu:' "$stamp" 2>/dev/null | cut -d' ' -f2- || true)
    echo "stale: built for ${built_for:-nothing}; this CPU: $cpu_model (flags $cpu_flags)"
    exit 1
fi
if current; then echo "$bin"; exit 0; fi
if [ -d "$build" ]; then
    echo "llama.cpp's tools under $build were not built for this CPU ($cpu_model): building them again" >&2
    rm -rf "$build"
fi
sources
src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
# Native, without ggml's AMX kernels: on this project's AMX machines (Sapphire Rapids VMs) they segfault in
# ggml_backend_amx_mul_mat on the Q4_1 file (llama-bench, llama-server; `--repack 0` avoids them at less
# than half the speed). Without AMX, llama.cpp repacks the types it has interleaved x86 layouts for (Q4_0,
# IQ4_NL, Q4_K, Q8_0; not Q4_1) as the prebuilt llama-cpp-python does. The flags follow -march=native, so
# they win; elsewhere they change nothing.
cpu_cmake="$src/ggml/src/ggml-cpu/CMakeLists.txt"
grep -q -- "-mno-amx-int8" "$cpu_cmake" || \
    sed -i 's/list(APPEND ARCH_FLAGS -march=native)/list(APPEND ARCH_FLAGS -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)/' "$cpu_cmake"
# shellcheck disable=SC2086
cmake -S "$src" -B "$build" $cmake_flags -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
# shellcheck disable=SC2086
cmake --build "$build" --target $tools -j "$(nproc)" >&2
{
    echo "llama-cpp-python sdist: $version"
    echo "cpu: $cpu_model"
    echo "cpu_flags_digest: $cpu_flags"
    echo "cmake: $cmake_flags (ARCH_FLAGS -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)"
    echo "compiler: $(${CXX:-c++} --version | head -1)"
} > "$stamp"
echo "$bin"
