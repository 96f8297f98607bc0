"""BatchedLoRA: a projection serving many adapters at once, rows with different adapters in one step
(the Punica / S-LoRA idea: the base product once for the batch, each adapter's low-rank product on
its own rows; no weight is merged).

    y = base(x)                                                  [B, S, N]  (the kernel plan's product)
    y[rows of slot s, :, start:stop] += f * scale_s * (x[rows] @ A_s^T) @ B_s^T   per adapter s (and factor f), target

The step's rows and their adapters come from the StepRows the layers share (slots.py); with none set
the layer is its base (a captured decode step records only that).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class Pair:
    """One target of one adapter on this layer: rows [start, stop) of the output += scale * B (A x)."""

    start: int
    stop: int
    a: Tensor  # [r, K], in the residual stream's dtype
    b: Tensor  # [stop - start, r]
    scale: float


class BatchedLoRA(nn.Module):
    """`base` with the pairs of the adapters loaded in slots (slot -> its Pairs on this layer)."""

    def __init__(self, base: nn.Module, step) -> None:
        super().__init__()
        self.base, self.step = base, step  # step: the shared StepRows (slots.py)
        self.adapters: dict[int, tuple[Pair, ...]] = {}  # replaced whole on load and unload (the loop reads it)

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        groups = self.step.groups
        if not groups:
            return y
        shape, rows = y.shape, self.step.batch
        xb, yb = x.reshape(rows, -1, x.shape[-1]), y.reshape(rows, -1, shape[-1])  # [B, S, K], [B, S, N]
        for slot, index, factor in groups:
            pairs = self.adapters.get(slot)
            if not pairs:
                continue
            xs, ys = xb.index_select(0, index), yb.index_select(0, index)  # the group's rows (copies)
            for p in pairs:
                a, b = p.a.to(xs.dtype), p.b.to(xs.dtype)  # the branch's dtype (the plan's kernels may take bf16)
                ys[..., p.start:p.stop] += (F.linear(F.linear(xs, a), b) * (p.scale * factor)).to(ys.dtype)
            yb = yb.index_copy(0, index, ys)
        return yb.reshape(shape)
