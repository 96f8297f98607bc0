"""Timing of one generation: time to first token, time per output token, decode throughput.

    TTFT  = first token ready - start               (tokenization excluded; prefill + first sample)
    TPOT  = (last token ready - first token ready) / (steps - 1)     (one decode step)
    tokens/s = batch rows * (steps - 1) / (last - first)             (decode throughput, all rows)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class StepClock:
    """Call `start()` before prefill and `tick()` (or append time.perf_counter() to `ticks`) each time a
    step's tokens are ready; the figures are computed from the ticks when asked for."""

    batch: int = 1
    started: float = 0.0
    ticks: list[float] = field(default_factory=list)  # when each step's tokens were ready

    def start(self) -> None:
        self.started, self.ticks = time.perf_counter(), []

    def tick(self) -> None:
        self.ticks.append(time.perf_counter())

    @property
    def steps(self) -> int:
        return len(self.ticks)

    @property
    def first(self) -> float | None:
        return self.ticks[0] if self.ticks else None

    @property
    def last(self) -> float | None:
        return self.ticks[-1] if self.ticks else None

    @property
    def ttft_s(self) -> float:
        return (self.first - self.started) if self.first is not None else 0.0

    @property
    def decode_s(self) -> float:
        return (self.last - self.first) if self.first is not None else 0.0

    @property
    def tpot_s(self) -> float:
        return self.decode_s / (self.steps - 1) if self.steps > 1 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.batch * (self.steps - 1) / self.decode_s if self.steps > 1 and self.decode_s > 0 else 0.0
