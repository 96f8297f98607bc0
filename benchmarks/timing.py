"""The timing helpers the benchmarks share: a median of wall-clock calls, the host's read bandwidth."""

from __future__ import annotations

import mmap
import statistics
import time
from typing import Callable

import torch

from anatomy import progress


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
    nbytes = 256 << 20
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    x = torch.frombuffer(region, dtype=torch.float32)
    x.fill_(1.0)
    seconds = median_seconds(x.sum, 7, warmup=True)
    del x
    region.close()
    return nbytes / seconds / 1e9
