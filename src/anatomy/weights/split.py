"""A weight whose rows are spans in formats of their own: a fused matrix whose parts have no common
exact format (llama.cpp's _M mixes give a fused q, k, v as Q4_K q and k beside a Q6_K v).

    SplitRowsWeight([int4 [2560, 2048], int6 [512, 2048]])   W [3072, 2048]: the parts' rows in order

Each part keeps its own blocks; a product with it is the parts' products side by side (an engine
runs each part as a linear layer of its own: SplitLinear, modules.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy.errors import InputError
from anatomy.weights.formats import WeightFormat


class SplitRowsWeight(WeightFormat):
    """W [sum of the parts' N, K]: rows [0, N0) are parts[0]'s, the next N1 parts[1]'s, and so on."""

    def __init__(self, parts: list[WeightFormat], *, label: str = "weight") -> None:
        if len(parts) < 2 or len({p.shape[1] for p in parts}) != 1:
            raise InputError(f"{label}: a split weight is two or more formats of one K, got "
                             f"{[p.signature for p in parts]}")
        super().__init__((sum(p.shape[0] for p in parts), parts[0].shape[1]), label=label)
        self.parts = nn.ModuleList(parts)

    @property
    def name(self) -> str:  # type: ignore[override]
        """The parts' names joined in row order, e.g. "int4+int6"."""
        return "+".join(p.name for p in self.parts)

    @property
    def signature(self) -> str:
        return "+".join(p.signature for p in self.parts)

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """Each part's rows [start, stop) of W."""
        out, start = [], 0
        for p in self.parts:
            out.append((start, start + p.shape[0]))
            start += p.shape[0]
        return out

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return torch.cat([p.dequantize(dtype) for p in self.parts])

    def rows(self, index: Tensor) -> Tensor:
        flat = index.reshape(-1)
        out = torch.empty(flat.shape[0], self.shape[1])
        for p, (start, stop) in zip(self.parts, self.bounds):
            inside = (flat >= start) & (flat < stop)
            if inside.any():
                out[inside] = p.rows(flat[inside] - start)
        return out.view(*index.shape, self.shape[1])

    def take_rows(self, index: Tensor) -> WeightFormat:
        """Rows `index` of W, each span of consecutive rows from one part taken from that part."""
        bounds = self.bounds
        owner = torch.bucketize(index, torch.tensor([stop for _, stop in bounds]), right=True)
        spans: list[WeightFormat] = []
        start = 0
        for i in range(1, len(index) + 1):
            if i == len(index) or owner[i] != owner[start]:
                j = int(owner[start])
                spans.append(self.parts[j].take_rows(index[start:i] - bounds[j][0]))
                start = i
        return spans[0] if len(spans) == 1 else SplitRowsWeight(spans, label=self.label)

    def take_columns(self, start: int, stop: int, *, label: str | None = None) -> WeightFormat:
        return SplitRowsWeight([p.take_columns(start, stop) for p in self.parts], label=label or self.label)

    def extra_repr(self) -> str:
        return f"{self.signature}, {self.nbytes / 2 ** 20:.2f} MiB, {self.label!r}"
