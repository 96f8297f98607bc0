"""The one timing helper the benchmarks share."""

from __future__ import annotations

import statistics
import time
from typing import Callable

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
