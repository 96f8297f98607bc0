"""int6: GGUF's Q6_K kept as it is stored, 6-bit codes under two levels of scales (6.5625 bits a weight).

    W[n, k] = d[n, k // 256] * scale[n, k // 16] * (q[n, k] - 32),   q in 0..63

Per super-block of 256 inputs of a row: a float16 `d`, 16 int8 sub-scales (one per 16 inputs) and the
codes in ggml's block_q6_K order, copied, not unpacked: `low` holds 128 bytes of low nibbles (per
half of 128 values, byte l holds value l in its low nibble and value l + 64 in its high one, l < 64),
`high` 64 bytes of the top 2 bits (per half, byte l holds values l, l + 32, l + 64, l + 96 in its bits
0-1, 2-3, 4-5, 6-7, l < 32). d * scale is exact in float32, and so is its product with q - 32 (at
most 23 significant bits), so dequantize() equals llama.cpp's reference dequantization bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from anatomy.errors import InputError
from anatomy.weights.factors import SUPER_BLOCK as SUPER  # inputs per super-block (one d)
from anatomy.weights.formats import WeightFormat

SUB = 16  # inputs per sub-scale


class Int6Weight(WeightFormat):
    """GGUF Q6_K's blocks as buffers: low [N, K/2] uint8, high [N, K/4] uint8, scale [N, K/16] int8,
    d [N, K/256] float16 (the module docstring has the order of the codes)."""

    name = "int6"

    def __init__(self, low: Tensor, high: Tensor, scale: Tensor, d: Tensor, *, label: str = "weight") -> None:
        K = low.shape[1] * 2 if low.dim() == 2 else 0
        N = low.shape[0] if low.dim() == 2 else 0
        expected = {"low": (low, torch.uint8, K // 2), "high": (high, torch.uint8, K // 4),
                    "scale": (scale, torch.int8, K // SUB), "d": (d, torch.float16, K // SUPER)}
        bad = [f"{key} {t.dtype} {list(t.shape)} (expected {dtype} {[N, width]})"
               for key, (t, dtype, width) in expected.items() if t.dtype != dtype or tuple(t.shape) != (N, width)]
        if N == 0 or K % SUPER or bad:
            raise InputError(f"{label}: int6 stores a weight [N, K] with K a positive multiple of {SUPER} as low "
                             f"uint8 [N, K/2], high uint8 [N, K/4], scale int8 [N, K/16], d float16 [N, K/256]; "
                             f"got K = {K}" + (f", {'; '.join(bad)}" if bad else ""))
        super().__init__((N, K), label=label)
        self.group = SUB
        self.register_buffer("low", low)
        self.register_buffer("high", high)
        self.register_buffer("scale", scale)
        self.register_buffer("d", d)

    def codes(self) -> Tensor:
        """q [N, K] uint8, 0..63, in the natural order of the inputs."""
        return _codes(self.low, self.high)

    def _values(self, low: Tensor, high: Tensor, scale: Tensor, d: Tensor) -> Tensor:
        n, K = low.shape[0], self.shape[1]
        q = _codes(low, high).reshape(n, K // SUB, SUB).float() - 32  # [n, K/16, 16]
        step = scale.float() * d.float().repeat_interleave(SUPER // SUB, dim=1)  # d * scale [n, K/16], exact
        return (q * step[..., None]).reshape(n, K)

    def take_columns(self, start: int, stop: int, *, label: str | None = None) -> WeightFormat:
        """Columns [start, stop) of W, cut on whole super-blocks of 256 (each has one d)."""
        if start % SUPER or stop % SUPER:
            raise InputError(f"{self.label} {self.signature}: columns [{start}, {stop}) do not fall on its "
                             f"super-blocks of {SUPER} inputs; a shard of its inputs must start and end on a "
                             f"multiple of {SUPER}")
        return super().take_columns(start, stop, label=label)


def _codes(low: Tensor, high: Tensor) -> Tensor:
    """ggml's Q6_K codes -> q [n, K] uint8 in the inputs' order."""
    n = low.shape[0]
    ql = low.reshape(n, -1, 2, 64)  # [n, super-blocks, halves, 64]
    qh = high.reshape(n, -1, 2, 1, 32)
    lo = torch.cat([ql & 0x0F, ql >> 4], dim=3)  # values 0-63 then 64-127 of each half
    hi = ((qh >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)) & 3).reshape(lo.shape)  # [n, sb, 2, 128]
    return (lo | (hi << 4)).reshape(n, -1)


def from_q6_k(blocks: np.ndarray, label: str) -> Int6Weight:
    """GGUF Q6_K blocks [N, K/256, 210] (ql 128 bytes, qh 64, int8 scales 16, float16 d) -> Int6Weight."""
    N = blocks.shape[0]

    def part(start: int, stop: int, dtype: type) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(blocks[..., start:stop]).view(dtype).reshape(N, -1))

    return Int6Weight(part(0, 128, np.uint8), part(128, 192, np.uint8), part(192, 208, np.int8),
                      part(208, 210, np.float16), label=label)
