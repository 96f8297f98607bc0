"""LoRALinear: a projection with low-rank updates added to row ranges of its output, unmerged.

    y = base(x)                                            [..., N]   (any linear: float, compact, planned)
    y[..., start:stop] += scale * (dropout(x) @ A^T) @ B^T  per target: A [r, K], B [stop - start, r]

A fused projection (anatomy's qkv, gate_up) holds one (A, B) pair per target it adapts, so an
adapter of q and v on qkv leaves the k rows as the base makes them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LoRALinear(nn.Module):
    """The base projection `base` [N, K] with LoRA pairs on `ranges` {target: (start, stop)} of its rows."""

    def __init__(self, base: nn.Module, *, ranges: dict[str, tuple[int, int]], in_features: int, out_features: int,
                 rank: int, scale: float, dropout: float = 0.0, device: torch.device | None = None) -> None:
        super().__init__()
        self.base = base
        self.in_features, self.out_features, self.rank, self.scale = in_features, out_features, rank, scale
        self.ranges = dict(sorted(ranges.items(), key=lambda item: item[1]))
        self.lora_A = nn.ParameterDict({t: nn.Parameter(torch.empty(rank, in_features, device=device))
                                        for t in self.ranges})  # [r, K]
        self.lora_B = nn.ParameterDict({t: nn.Parameter(torch.empty(stop - start, rank, device=device))
                                        for t, (start, stop) in self.ranges.items()})  # [rows, r]
        self.dropout = nn.Dropout(dropout)
        self._pieces = _pieces(self.ranges, out_features)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PEFT's initialisation: A as nn.Linear's default (Kaiming uniform), B zero (so a new adapter adds nothing)."""
        for a, b in zip(self.lora_A.values(), self.lora_B.values()):
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
            nn.init.zeros_(b)

    def forward(self, x: Tensor) -> Tensor:
        """The base's product (an engine's planned kernel may give it in its own dtype: the sum keeps
        that dtype) plus each target's."""
        y = self.base(x)  # [..., N]
        if len(self._pieces) == 1:
            return y + self.product(self._pieces[0][0], x).to(y.dtype)
        pieces = y.split([size for _, size in self._pieces], dim=-1)
        return torch.cat([p if t is None else p + self.product(t, x).to(p.dtype)
                          for (t, _), p in zip(self._pieces, pieces)], -1)

    def product(self, target: str, x: Tensor) -> Tensor:
        """scale * B (A dropout(x)) of one target: x [..., K] -> [..., stop - start]."""
        a, b = self.lora_A[target], self.lora_B[target]
        return F.linear(F.linear(self.dropout(x), a.to(x.dtype)), b.to(x.dtype)) * self.scale  # [..., r] -> [..., rows]

    def delta(self, target: str) -> Tensor:
        """The update of the target's rows of the weight, scale * B @ A [stop - start, K], in f32."""
        return (self.lora_B[target].float() @ self.lora_A[target].float()) * self.scale

    def extra_repr(self) -> str:
        return f"targets={list(self.ranges)}, rank={self.rank}, scale={self.scale:g}"


def _pieces(ranges: dict[str, tuple[int, int]], rows: int) -> list[tuple[str | None, int]]:
    """The output rows cut into (target or None, size) pieces, in order, covering [0, rows)."""
    pieces, at = [], 0
    for target, (start, stop) in ranges.items():
        if start > at:
            pieces.append((None, start - at))
        pieces.append((target, stop - start))
        at = stop
    if at < rows:
        pieces.append((None, rows - at))
    return pieces
