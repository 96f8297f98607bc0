"""This machine's roofs for `anatomy profile`, measured in the run: read bandwidth and matmul peak
per compute dtype (analysis/hardware.measure_local), the time one small op takes (the dispatch
latency under every op), and how much of the machine other processes used meanwhile."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from anatomy import dtypes
from anatomy.analysis.hardware import (INTEGER_ROOFS, Hardware, measure_integer_peaks, measure_local,
                                       measure_matmul_peak)

BUSY_SHARE = 0.1  # other processes' share of the machine's CPU time above which the report warns


class Machine:
    """This machine's roofs, measured once: the read bandwidth, and the matmul peak of each compute
    dtype the first time a run computes in it (a what-if in bf16 adds the bf16 peak), and the time
    one small op takes. Given a Hardware (a test's fixed roofs), only the op's time is measured."""

    def __init__(self, hardware: Hardware | None = None, *, op_latency_s: float | None = None) -> None:
        self.hardware = hardware
        self._latency = op_latency_s

    @property
    def op_latency_s(self) -> float:
        """The time one small op takes here (measured once): the floor under every op's time."""
        if self._latency is None:
            self._latency = measure_op_latency()
        return self._latency

    def roofs(self, dtype: str) -> Hardware:
        hw = self.hardware
        if hw is None:
            self.hardware = measure_local(compute_dtypes=(dtype,))
        elif dtype not in hw.peak_flops and hw.name == "local":
            peak = measure_matmul_peak(torch.device("cpu"), dtype=dtypes.torch_dtype(dtype))
            self.hardware = dataclasses.replace(hw, peak_flops={**hw.peak_flops, dtype: peak},
                                                source=hw.source.replace(" matmul", f"/{dtype} matmul", 1), notes="")
        return self.hardware

    def integer_roofs(self) -> Hardware:
        """The roofs with the peaks of the integer products this CPU runs added (hardware.py), measured
        once; a given Hardware's roofs are its own."""
        hw = self.hardware
        if hw is not None and hw.name == "local" and not INTEGER_ROOFS & set(hw.peak_flops):
            if peaks := measure_integer_peaks():
                self.hardware = dataclasses.replace(hw, peak_flops={**hw.peak_flops, **peaks},
                                                    source=hw.source + "; integer products: " + ", ".join(peaks))
        return self.hardware


def measure_op_latency(*, calls: int = 2000, repeats: int = 5) -> float:
    """Seconds one small op takes on this machine, dispatch included: the best of `repeats` means
    over `calls` additions of two [1, 64] tensors (no profiler)."""
    import time

    a, b = torch.ones(1, 64), torch.ones(1, 64)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                torch.add(a, b)
            best = min(best, (time.perf_counter() - start) / calls)
    return best


def cpu_sample() -> tuple[float, float, float] | None:
    """(seconds of CPU time all processes used, of it this process, wall seconds): Linux's /proc/stat."""
    import os
    import time

    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    mine = os.times()
    return busy / tick, mine.user + mine.system, time.monotonic()


def load_note(before: tuple[float, float, float] | None) -> dict[str, Any]:
    """The share of the machine's CPU time other processes used during the run: they stretch every
    step (and stall intra-op threads waiting for each other), so a shared machine's times are slower
    than its speed."""
    import os

    after = cpu_sample()
    cores = os.cpu_count() or 1
    if before is None or after is None or after[2] <= before[2]:
        return {"cores": cores, "others_cpu_share": None, "note": ""}
    others = max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / ((after[2] - before[2]) * cores)
    note = (f"other processes used {others:.0%} of the {cores} cores' time during the run: times are inflated"
            if others > BUSY_SHARE else "")
    return {"cores": cores, "others_cpu_share": others, "note": note}


def machine_dict(machine: Hardware, compute: str) -> dict[str, Any]:
    return {"name": machine.name, "bandwidth_bytes_per_s": machine.bandwidth,
            "peak_flops_per_s": machine.peak(compute), "peak_flops_per_s_by_dtype": dict(machine.peak_flops),
            "ridge_flops_per_byte": machine.peak(compute) / machine.bandwidth, "source": machine.source}
