"""Loading SmolLM2-135M-Instruct's Q4_1 GGUF into a ready fp32 model: anatomy against HF
transformers' GGUF path (`from_pretrained(dir, gguf_file=...)`), same file, same run.

Every load runs in a fresh Python process, so that its peak RSS (ru_maxrss) is its own: the
figure includes the interpreter and the imported libraries, measured before the load too.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from rich.console import Console
from rich.table import Table

REPEATS = 3  # anatomy's load; HF's (about a minute) runs once

_CHILD = r"""
import json, resource, sys, time
import torch
path = sys.argv[2]
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
if sys.argv[1] == "anatomy":
    from anatomy.checkpoints.gguf import load_gguf
    load = lambda: load_gguf(path, dtype=torch.float32)
else:
    import os
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.disable_progress_bar()
    load = lambda: AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                        dtype=torch.float32)
before = rss_mb()
start = time.perf_counter()
model = load()
seconds = time.perf_counter() - start
weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "rss_before_mb": before, "peak_rss_mb": peak, "weights_mb": weights}))
"""


def _load_in_fresh_process(which: str, path: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, which, path], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    from anatomy.checkpoints.registry import resolve

    path = str(resolve("smollm2-135m-instruct"))
    ours = _median([_load_in_fresh_process("anatomy", path) for _ in range(REPEATS)])
    hf = _load_in_fresh_process("hf", path)
    table = Table(title="load SmolLM2-135M-Instruct Q4_1 GGUF -> fp32 model (fresh process per load)")
    for column in ("", f"anatomy (median of {REPEATS})", "HF transformers", "HF / anatomy"):
        table.add_column(column, justify="right")
    table.add_row("load time", f"{ours['seconds']:.2f} s", f"{hf['seconds']:.1f} s", f"{hf['seconds'] / ours['seconds']:.0f}x")
    table.add_row("peak RSS (process)", f"{ours['peak_rss_mb']:.0f} MiB", f"{hf['peak_rss_mb']:.0f} MiB",
                  f"{hf['peak_rss_mb'] / ours['peak_rss_mb']:.1f}x")
    table.add_row("RSS before the load", f"{ours['rss_before_mb']:.0f} MiB", f"{hf['rss_before_mb']:.0f} MiB", "")
    table.add_row("fp32 weights", f"{ours['weights_mb']:.0f} MiB", f"{hf['weights_mb']:.0f} MiB", "")
    Console(width=120).print(table)
    ratio = ours["peak_rss_mb"] / ours["weights_mb"]
    print(f"anatomy peak RSS = {ratio:.2f}x the fp32 weight bytes (target <= 2x); load target <= 3 s")
