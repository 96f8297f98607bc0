"""Native llama.cpp tools for the side-by-side benchmarks: llama-server, llama-bench, llama-batched-bench.

    llama_tool("llama-bench")   -> the path of the binary: $LLAMA_CPP_BIN/<tool>, else on PATH, else built
                                   once by benchmarks/build_llama_cpp.sh (~10-15 min on 2 cores)

They are built from the llama.cpp sources inside the llama-cpp-python 0.3.36 sdist (the same llama.cpp
the Python binding runs), outside this repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def llama_tool(name: str) -> str:
    folder = os.environ.get("LLAMA_CPP_BIN")
    if folder and (Path(folder) / name).exists():
        return str(Path(folder) / name)
    if name == "llama-server" and os.environ.get("LLAMA_SERVER"):
        return os.environ["LLAMA_SERVER"]
    if found := shutil.which(name):
        return found
    print(f"{name}: benchmarks/build_llama_cpp.sh (builds llama.cpp's tools the first time, ~10-15 min)", flush=True)
    out = subprocess.run(["bash", str(HERE / "build_llama_cpp.sh")], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": sys.executable})
    if out.returncode != 0:
        raise RuntimeError(f"building llama.cpp's tools failed:\n{out.stderr[-3000:]}")
    return str(Path(out.stdout.strip().splitlines()[-1]) / name)
