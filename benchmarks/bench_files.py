"""The files people download, at 135M and 1B: anatomy beside native llama.cpp on each llama-quantize type,
speed and peak RSS (benchmarks/downloaded.py; `python -m benchmarks decode` runs the same table).

    python -m benchmarks files
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks import downloaded
from benchmarks.llama_cpp import llama_bench_record, llama_tool
from benchmarks.provenance import anatomy_lines, llama_lines, print_provenance
from benchmarks.timing import bandwidth_gbs


def main() -> None:
    bandwidth = bandwidth_gbs()
    with tempfile.TemporaryDirectory(dir=Path.home()) as tmp:
        rows = downloaded.measure(Path(tmp))
    downloaded.print_table(rows, bandwidth)
    print_provenance(anatomy_lines(bandwidth) + llama_lines(llama_tool("llama-bench"), None))


if __name__ == "__main__":
    main()
