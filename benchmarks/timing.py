"""The timing helpers the benchmarks share: a median of wall-clock calls, the host's read bandwidth."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from anatomy import huge_pages, progress


def median_seconds(fn: Callable[[], object], repeats: int = 3, *, warmup: bool = False) -> float:
    """Median wall-clock seconds of `repeats` calls of fn (after one untimed call when warmup)."""
    if warmup:
        fn()
    times = []
    for _ in progress.track(range(repeats), "timing"):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bandwidth_gbs() -> float:
    """The host's read bandwidth now, GB/s: torch's sum over 256 MiB of fp32 on memory advised onto 2 MiB
    pages (as the engine's layouts lie; on 4 KiB pages the sum is bound by the TLB well below it), the
    median of 7 calls."""
    x = torch.ones(64 * 1024 * 1024)
    huge_pages.hold([x], large=x.nbytes + 1)  # where the system gives them, as analysis/hardware.measure_local
    return x.nbytes / median_seconds(x.sum, 7, warmup=True) / 1e9
