"""Build anatomy's native kernels (gemv.cpp, gemv_avx2.cpp, exact.cpp, attention.cpp, norm.cpp, block.cpp, tiles.cpp;
native.h, gemv_avx2.h, avx2.h) into a shared library that `torch.ops.load_library` loads.

    python -m anatomy.kernels.native.build       (what `make` runs; ~45 s on 2 cores, once per source
                                                  and torch version)

The library goes to `_build/` next to the source, named by a digest of the source, the torch version
and the compiler flags, so a changed source or another torch builds anew and a stale library is never
loaded. Each source compiles to an object of its own (named by the same digest of it and the headers),
the objects in parallel, one per core; a source that did not change is not compiled again. The AVX-512
and AVX2 code paths are compiled for their targets alone (function attributes) and taken only where
the CPU has them, so one build runs on any x86-64 machine. A failed build is not fatal: the kernel plan
then measures torch's kernels only.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = (HERE / "gemv.cpp", HERE / "gemv_avx2.cpp", HERE / "exact.cpp", HERE / "attention.cpp", HERE / "norm.cpp",
           HERE / "block.cpp", HERE / "tiles.cpp")
HEADERS = (HERE / "native.h", HERE / "gemv_avx2.h", HERE / "avx2.h")
FLAGS = ["-O3", "-std=c++17", "-fPIC", "-fopenmp", "-D_GLIBCXX_USE_CXX11_ABI=1", "-DTORCH_API_INCLUDE_EXTENSION_H"]
BUILD = HERE / "_build"


def _digest(*sources: Path) -> str:
    import torch

    text = b"".join(source.read_bytes() for source in sources + HEADERS)
    return hashlib.sha256(text + torch.__version__.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]


def library_path() -> Path:
    """Where the library of this source, torch version and flags lives (built or not)."""
    return BUILD / f"anatomy_kernels-{_digest(*SOURCES)}.so"


def _object_path(source: Path) -> Path:
    return BUILD / "objects" / f"{source.stem}-{_digest(source)}.o"


def compile_command(source: Path, output: Path) -> list[str]:
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    return ["g++", *FLAGS, *includes, "-c", str(source), "-o", str(output)]


def link_command(objects: list[Path], output: Path) -> list[str]:
    from torch.utils import cpp_extension

    libs = [f"-L{p}" for p in cpp_extension.library_paths()]
    rpath = [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    return ["g++", "-shared", "-fopenmp", *map(str, objects), "-o", str(output), *libs, *rpath, "-lc10", "-ltorch_cpu",
            "-ltorch"]


def _compile(source: Path) -> Path:
    output = _object_path(source)
    if not output.exists():
        partial = output.with_suffix(".partial")
        subprocess.run(compile_command(source, partial), check=True)
        partial.replace(output)
    return output


def build() -> Path:
    """Compile the library if it is not there yet; its path."""
    output = library_path()
    if output.exists():
        return output
    (BUILD / "objects").mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        objects = list(pool.map(_compile, SOURCES))
    partial = output.with_suffix(".partial")
    subprocess.run(link_command(objects, partial), check=True)
    partial.replace(output)  # never a half-written library where a good one is looked for
    for old in [*BUILD.glob("anatomy_kernels-*.so"), *(BUILD / "objects").glob("*.o")]:
        if old != output and old not in objects:
            old.unlink()
    return output


if __name__ == "__main__":
    print(build())
    sys.exit(0)
