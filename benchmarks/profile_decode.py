"""Where a decode step's time goes: torch.profiler over 20 eager decode steps of SmolLM2-135M
(batch 1 or `python -m benchmarks.profile_decode 8`), operators sorted by self CPU time, and the
bandwidth the matrix products reach (weight bytes read / time in aten::mm and aten::bmm)."""

from __future__ import annotations

import sys

from torch.profiler import profile

import anatomy
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams

STEPS = 20


def main(batch: int = 1) -> None:
    model = anatomy.load("smollm2-135m-instruct")
    prompts = [list(range(300 + i, 428 + i)) for i in range(batch)]
    steps = DecoderEngine(model).tokens(prompts, SamplingParams(max_new_tokens=STEPS + 5))
    for _ in range(5):  # prefill and warm-up
        next(steps)
    with profile() as prof:
        for _ in range(STEPS):
            next(steps)
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=12))
    mm_s = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::bmm")) / 1e6
    total_s = sum(e.self_cpu_time_total for e in events) / 1e6
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"batch {batch}: {total_s / STEPS * 1e3:.1f} ms per step, of which the matrix products (aten::mm, aten::bmm) {mm_s / STEPS * 1e3:.1f} ms "
          f"({mm_s / total_s:.0%}); weights {weights / 1e6:.0f} MB per step -> the matrix products read "
          f"{weights * STEPS / mm_s / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
