"""benchmarks/build_llama_cpp.sh reuses a build of llama.cpp's tools only on the CPU it was made for."""

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "build_llama_cpp.sh"
TOOLS = ("llama-server", "llama-bench", "llama-batched-bench", "llama-perplexity", "llama-quantize")


def check(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--check"], capture_output=True, text=True,
                          env={**os.environ, "LLAMA_SERVER_DIR": str(folder)})


def test_a_build_stamped_for_other_cpu_flags_is_stale(tmp_path):
    build = tmp_path / "build-no-amx"
    (build / "bin").mkdir(parents=True)
    for tool in TOOLS:
        (build / "bin" / tool).write_text("#!/bin/sh\n")
        (build / "bin" / tool).chmod(0o755)
    stamp = build / "build-info.txt"
    stamp.write_text("cpu: Some Other CPU\ncpu_flags_digest: 0000000000000000\n")
    out = check(tmp_path)
    assert out.returncode == 1 and out.stdout.startswith("stale: built for Some Other CPU; this CPU:")
    digest = out.stdout.split("(flags ")[1].rstrip(")\n")
    stamp.write_text(f"cpu: this one\ncpu_flags_digest: {digest}\n")  # this CPU's flags
    out = check(tmp_path)
    assert (out.returncode, out.stdout) == (0, "current\n")
    (build / "bin" / "llama-perplexity").unlink()  # a tool missing: not current either
    assert check(tmp_path).returncode == 1


def test_an_unstamped_build_is_stale(tmp_path):
    (tmp_path / "build-no-amx" / "bin").mkdir(parents=True)
    out = check(tmp_path)
    assert out.returncode == 1 and "built for nothing" in out.stdout
