"""Native llama.cpp tools for the side-by-side benchmarks: llama-server, llama-bench, llama-batched-bench,
llama-perplexity, llama-quantize.

    llama_tool("llama-bench")   -> the path of the binary: $LLAMA_CPP_BIN/<tool>, else on PATH, else built
                                   by benchmarks/build_llama_cpp.sh for this CPU (~10-15 min on 2 cores;
                                   a build made for another CPU's flags is made again)
    build_info(tool)            -> what that build is: its stamp (CPU, flags, cmake options) or, for a
                                   tool found elsewhere, "not built by anatomy" and its version line
    llama_sources()             -> the llama.cpp source folder (convert_hf_to_gguf.py, gguf-py), unpacked
                                   without building anything (`make test` does it)

They are built from the llama.cpp sources inside the llama-cpp-python 0.3.36 sdist (the same llama.cpp
the Python binding runs), outside this repository.
"""

from __future__ import annotations

import functools
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
    return str(built_tools() / name)


@functools.cache
def built_tools() -> Path:
    """The folder of the tools build_llama_cpp.sh made for this CPU (building them when absent or stale)."""
    print("llama.cpp's tools: benchmarks/build_llama_cpp.sh (builds them for this CPU when needed, ~10-15 min)",
          flush=True)
    out = subprocess.run(["bash", str(HERE / "build_llama_cpp.sh")], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": sys.executable})
    if out.returncode != 0:
        raise RuntimeError(f"building llama.cpp's tools failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


@functools.cache
def llama_sources() -> Path:
    """The llama.cpp sources of the sdist the tools are built from (unpacked, nothing built)."""
    out = subprocess.run(["bash", str(HERE / "build_llama_cpp.sh"), "--sources"], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": sys.executable})
    if out.returncode != 0:
        raise RuntimeError(f"unpacking llama.cpp's sources failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def build_info(tool: str) -> str:
    """One line on the build of `tool` (a path from llama_tool): the stamp build_llama_cpp.sh wrote beside
    it, else that it was not built here, with its own version line where it prints one."""
    stamp = Path(tool).parent.parent / "build-info.txt"
    if stamp.exists():
        return "; ".join(line.strip() for line in stamp.read_text().splitlines() if line.strip())
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30)
    version = " ".join((out.stdout + out.stderr).split())[:200]
    return f"not built by anatomy ({tool}): {version or 'no version line'}"


def llama_bench(model: Path, *, threads: int, prompt: int = 0, new: int = 0, depth: int = 0,
                repetitions: int = 3) -> float:
    """tokens/s `llama-bench` measures for a prompt of `prompt` tokens (pp) or `new` generated ones (tg),
    after `depth` tokens already in the context (its -d), on `threads` threads: the mean of its
    `repetitions` runs (its -r) after its warm-up."""
    return float(llama_bench_record(model, threads=threads, prompt=prompt, new=new, depth=depth,
                                    repetitions=repetitions)["avg_ts"])


def llama_bench_record(model: Path, *, threads: int, prompt: int = 0, new: int = 0, depth: int = 0,
                       repetitions: int = 3) -> dict:
    """llama-bench's own JSON record of one test: avg_ts, and what it ran (build_commit, build_number,
    cpu_info, backends, n_threads, model_type, ...)."""
    import json

    args = [llama_tool("llama-bench"), "-m", str(model), "-t", str(threads), "-p", str(prompt), "-n", str(new),
            "-o", "json", "-r", str(repetitions)]
    if depth:
        args += ["-d", str(depth)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)[0]


def batched_bench(model: Path, *, threads: int, prompt: int, new: int, sequences: tuple[int, ...]) -> dict[int, float]:
    """{sequences: decode tokens/s over all of them} from `llama-batched-bench -npp prompt -ntg new
    -npl ...` (its S_TG column; every sequence has its own prompt, as in a server)."""
    args = [llama_tool("llama-batched-bench"), "-m", str(model), "-t", str(threads), "-npp", str(prompt),
            "-ntg", str(new), "-npl", ",".join(map(str, sequences)), "-c", str(max(sequences) * (prompt + new) + 16)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"llama-batched-bench failed:\n{out.stderr[-2000:]}")
    return _tg_column(out.stdout + out.stderr)


def _tg_column(text: str) -> dict[int, float]:
    """The B -> S_TG t/s rows of llama-batched-bench's table."""
    header, rows = None, {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "S_TG t/s" in cells:
            header = cells
        elif header and len(cells) == len(header) and cells[0].isdigit():
            rows[int(cells[header.index("B")])] = float(cells[header.index("S_TG t/s")])
    if not rows:
        raise RuntimeError(f"no S_TG rows in llama-batched-bench's output:\n{text[-2000:]}")
    return rows
