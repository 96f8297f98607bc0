"""Decode-time matrix products that use every core.

In a decode step every linear layer multiplies a few rows (one per sequence) by its weight. MKL's
matrix-vector product can run on one thread however many torch is given, leaving the memory
bandwidth of the other cores unused. Viewing the weight W [N, K] as c chunks of rows and
multiplying them in one batched matmul,

    x [c, M, K] (the same rows, expanded) @ W.view(c, N/c, K).transpose(1, 2) [c, K, N/c] -> [c, M, N/c]

lets torch give each chunk its own thread. The weight is not copied (a view) and each output is the
same dot product. Whether it pays is measured, not assumed (`python -m benchmarks.profile_decode`;
docs/inference.md has the figures of the machines it was measured on). Inputs with many rows
(prefill) keep F.linear, whose multi-threaded GEMM is compute-bound anyway.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MAX_ROWS = 16  # above this, a GEMM: F.linear is already multi-threaded


class ChunkedLinear(nn.Linear):
    """An nn.Linear (same parameters, same state dict) whose few-row products run chunk-parallel."""

    chunks: int = 2

    def forward(self, x: Tensor) -> Tensor:
        N, K = self.weight.shape
        rows = x.numel() // K
        if rows > MAX_ROWS or N % self.chunks:
            return F.linear(x, self.weight, self.bias)
        c = self.chunks
        xs = x.reshape(1, rows, K).expand(c, rows, K)  # [c, M, K]
        y = torch.bmm(xs, self.weight.view(c, N // c, K).transpose(1, 2))  # [c, M, N/c]
        y = y.transpose(0, 1).reshape(*x.shape[:-1], N)  # [M, c, N/c] -> [..., N]
        return y + self.bias if self.bias is not None else y


def use_chunked_linears(model: nn.Module, chunks: int | None = None) -> None:
    """Make the model's nn.Linear layers ChunkedLinear in place (CPU, more than one thread)."""
    chunks = chunks or torch.get_num_threads()
    if chunks < 2 or next(model.parameters()).device.type != "cpu":
        return
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = ChunkedLinear
            module.chunks = chunks
