"""The 2026 families as files people download: Gemma 3 1B's shape and a 1B-class Qwen3-MoE, each
quantized by llama-quantize to Q4_K_M, anatomy beside native llama.cpp (speed and peak RSS;
benchmarks/downloaded.py).

    python -m benchmarks families
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks import downloaded
from benchmarks.timing import bandwidth_gbs
from benchmarks.llama_cpp import llama_tool
from benchmarks.provenance import anatomy_lines, llama_lines, print_provenance


def main() -> None:
    bandwidth = bandwidth_gbs()
    with tempfile.TemporaryDirectory(dir=Path.home()) as tmp:
        rows = downloaded.measure(Path(tmp), sizes=downloaded.FAMILIES)
    downloaded.print_table(rows, bandwidth)
    print_provenance(anatomy_lines(bandwidth) + llama_lines(llama_tool("llama-bench"), None))


if __name__ == "__main__":
    main()
