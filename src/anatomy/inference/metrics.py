"""Timing of one generation: time to first token, time per output token, decode throughput.

    TTFT  = first token ready - start               (tokenization excluded; prefill + first sample)
    TPOT  = (last token ready - first token ready) / (steps - 1)     (one decode step)
    tokens/s = batch rows * (steps - 1) / (last - first)             (decode throughput, all rows)
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class StepClock:
    """Call `start()` before prefill and `tick()` each time a step's tokens are ready."""

    batch: int = 1
    started: float = 0.0
    first: float | None = None
    last: float | None = None
    steps: int = 0

    def start(self) -> None:
        self.started, self.first, self.last, self.steps = time.perf_counter(), None, None, 0

    def tick(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last, self.steps = now, self.steps + 1

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
