"""Build anatomy's native kernels (gemv.cpp, gemv_avx2.cpp, exact.cpp, attention.cpp, norm.cpp, block.cpp, tiles.cpp,
q5.cpp, q6k.cpp, q6_tiles.cpp, argmax.cpp, causal.cpp; native.h, gemv_avx2.h, avx2.h, avx512.h) into a shared library that `torch.ops.load_library` loads.

    python -m anatomy.kernels.native.build       (`make kernels`; `pip install` runs it too where torch is
                                                  importable (setup.py), else the first use does: library.py)

The library is named by a digest of the source, the torch version and the compiler flags, so a changed
source or another torch builds anew and a stale library is never loaded; it goes to `_build/` next to
the source unless told where. Each source compiles to an object of its own (named by the same digest of
it and the headers), the objects in parallel, one per core; a source that did not change is not compiled
again. On x86-64 the AVX-512 and AVX2 code paths are compiled for their targets alone (function
attributes) and taken only where the CPU has them, so one build runs on any x86-64 machine; any other
CPU builds the portable loops alone. The compiler is $CXX, else g++. Needs the standard library and
torch only (setup.py loads this file before anatomy is installed).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

HERE = Path(__file__).parent
SOURCES = (HERE / "gemv.cpp", HERE / "gemv_avx2.cpp", HERE / "exact.cpp", HERE / "attention.cpp", HERE / "norm.cpp",
           HERE / "block.cpp", HERE / "tiles.cpp", HERE / "q5.cpp", HERE / "q6k.cpp", HERE / "q6_tiles.cpp",
           HERE / "argmax.cpp", HERE / "causal.cpp", HERE / "peak.cpp")
HEADERS = (HERE / "native.h", HERE / "gemv_avx2.h", HERE / "avx2.h", HERE / "avx512.h")
FLAGS = ["-O3", "-std=c++17", "-fPIC", "-fopenmp", "-D_GLIBCXX_USE_CXX11_ABI=1", "-DTORCH_API_INCLUDE_EXTENSION_H"]
BUILD = HERE / "_build"
COMPILER_ENV = "CXX"


def compiler() -> str:
    """The C++ compiler the build runs: $CXX, else g++."""
    return os.environ.get(COMPILER_ENV) or "g++"


def _digest(*sources: Path) -> str:
    import torch

    text = b"".join(source.read_bytes() for source in sources + HEADERS)
    return hashlib.sha256(text + torch.__version__.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]


def library_name() -> str:
    """The file name of the library of this source, torch version and flags."""
    return f"anatomy_kernels-{_digest(*SOURCES)}.so"


def library_path() -> Path:
    """Where `make kernels` puts the library of this source, torch version and flags (built or not)."""
    return BUILD / library_name()


def _object_path(source: Path, objects: Path) -> Path:
    return objects / f"{source.stem}-{_digest(source)}.o"


def compile_command(source: Path, output: Path) -> list[str]:
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    return [compiler(), *FLAGS, *includes, "-c", str(source), "-o", str(output)]


def link_command(objects: list[Path], output: Path) -> list[str]:
    from torch.utils import cpp_extension

    libs = [f"-L{p}" for p in cpp_extension.library_paths()]
    rpath = [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    return [compiler(), "-shared", "-fopenmp", *map(str, objects), "-o", str(output), *libs, *rpath, "-lc10",
            "-ltorch_cpu", "-ltorch"]


def _partial(path: Path) -> Path:
    """A sibling to write first: renamed over `path` once whole (its own per process and thread)."""
    import threading

    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.partial")


def _run(command: list[str], log: IO[str] | None) -> None:
    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT if log else None)


def _compile(source: Path, objects: Path, log: IO[str] | None) -> Path:
    output = _object_path(source, objects)
    if not output.exists():
        partial = _partial(output)
        try:
            _run(compile_command(source, partial), log)
            partial.replace(output)
        finally:
            partial.unlink(missing_ok=True)
    return output


def build(directory: Path = BUILD, *, objects: Path | None = None, log: IO[str] | None = None,
          prune: bool = True) -> Path:
    """Compile the library into `directory` if it is not there yet (objects into `objects`, by default
    directory/objects; the compiler's output to `log`, by default this process's); its path. `prune`
    removes the libraries and objects of other sources or torch versions found there.
    Raises FileNotFoundError without the compiler, subprocess.CalledProcessError when it fails."""
    output = directory / library_name()
    if output.exists():
        return output
    objects = objects or directory / "objects"
    for folder in (directory, objects):
        folder.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        built = list(pool.map(lambda source: _compile(source, objects, log), SOURCES))
    partial = _partial(output)
    try:
        _run(link_command(built, partial), log)
        partial.replace(output)  # never a half-written library where a good one is looked for
    finally:
        partial.unlink(missing_ok=True)
    if prune:
        for old in [*directory.glob("anatomy_kernels-*.so"), *objects.glob("*.o")]:
            if old != output and old not in built:
                old.unlink(missing_ok=True)
    return output


if __name__ == "__main__":
    print(build())
    sys.exit(0)
