"""What a benchmark ran, printed beside its figures: anatomy's commit, torch, the native kernels' vector
code, the CPU and its measured read bandwidth; llama.cpp's commit, build number and CPU line (from
llama-bench's own JSON record) and how its tools were built (benchmarks/llama_cpp.py build_info)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from anatomy.kernels import native
from anatomy.kernels.cache import machine_key

ROOT = Path(__file__).parents[1]


def anatomy_commit() -> str:
    """The checkout's commit, "+changes" when the work tree differs from it; "unknown" outside git."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "--short=12", "HEAD")
    if not commit:
        return "unknown"
    return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def anatomy_lines(bandwidth_gbs: float | None = None) -> list[str]:
    machine = machine_key()
    library = f"loaded, {native.isa()}" if native.loaded() else "not loaded (torch's kernels only)"
    lines = [f"anatomy {anatomy_commit()}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
             f"native kernels: {library}",
             f"machine: {machine['cpu']} ({machine['logical_cpus']} logical CPUs)"]
    if bandwidth_gbs is not None:
        lines[-1] += f"; measured read bandwidth {bandwidth_gbs:.1f} GB/s (torch sum over 256 MiB on 2 MiB pages)"
    return lines


def llama_lines(tool: str, record: dict | None = None) -> list[str]:
    """llama.cpp's provenance: the tool's build, and llama-bench's record of what it ran when given."""
    from benchmarks.llama_cpp import build_info

    lines = [f"llama.cpp build: {build_info(tool)}"]
    if record:
        lines.append(f"llama.cpp ran: commit {record.get('build_commit')} (build {record.get('build_number')}), "
                     f"cpu_info {record.get('cpu_info')!r}, backends {record.get('backends')}, "
                     f"{record.get('n_threads')} threads, model_type {record.get('model_type')!r}")
    return lines


def print_provenance(lines: list[str]) -> None:
    print("\nprovenance:")
    for line in lines:
        print(f"- {line}")
