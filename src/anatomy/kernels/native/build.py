"""Build anatomy's native kernels (gemv.cpp, exact.cpp, attention.cpp, norm.cpp, block.cpp; native.h) into
a shared library that `torch.ops.load_library` loads.

    python -m anatomy.kernels.native.build       (what `make` runs; ~30 s on 2 cores, once per source
                                                  and torch version)

The library goes to `_build/` next to the source, named by a digest of the source, the torch version
and the compiler flags, so a changed source or another torch builds anew and a stale library is never
loaded. The AVX-512 code paths are compiled for that target alone (function attributes) and taken only
where the CPU has it, so one build runs on any x86-64 machine. A failed build is not fatal: the kernel
plan then measures torch's kernels only.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = (HERE / "gemv.cpp", HERE / "exact.cpp", HERE / "attention.cpp", HERE / "norm.cpp", HERE / "block.cpp")
HEADERS = (HERE / "native.h",)
FLAGS = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-D_GLIBCXX_USE_CXX11_ABI=1", "-DTORCH_API_INCLUDE_EXTENSION_H"]


def library_path() -> Path:
    """Where the library of this source, torch version and flags lives (built or not)."""
    import torch

    text = b"".join(source.read_bytes() for source in SOURCES + HEADERS)
    digest = hashlib.sha256(text + torch.__version__.encode() + " ".join(FLAGS).encode()).hexdigest()
    return HERE / "_build" / f"anatomy_kernels-{digest[:16]}.so"


def command(output: Path) -> list[str]:
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    libs = [f"-L{p}" for p in cpp_extension.library_paths()]
    rpath = [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    return ["g++", *FLAGS, *includes, *map(str, SOURCES), "-o", str(output), *libs, *rpath, "-lc10", "-ltorch_cpu",
            "-ltorch"]


def build() -> Path:
    """Compile the library if it is not there yet; its path."""
    output = library_path()
    if output.exists():
        return output
    output.parent.mkdir(exist_ok=True)
    partial = output.with_suffix(".partial")
    subprocess.run(command(partial), check=True)
    partial.replace(output)  # never a half-written library where a good one is looked for
    for old in output.parent.glob("anatomy_kernels-*.so"):
        if old != output:
            old.unlink()
    return output


if __name__ == "__main__":
    print(build())
    sys.exit(0)
