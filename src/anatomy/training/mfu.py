"""Model FLOPs utilisation: the FLOPs a training step must do, over what the hardware can do.

FLOPs per trained token = 6N (forward 2N + backward 4N over the N non-embedding-lookup weights)
+ 12·L·T·D for attention scores and their weighted sum (forward and backward), as in the PaLM
paper's appendix. The peak is measured here: a large fp32 (or bf16 on GPU) matmul.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from anatomy.config import ModelConfig


def flops_per_token(model: nn.Module, config: ModelConfig, seq_len: int) -> float:
    """6N + 12·L·T·D, N counting every parameter except the position table (a lookup, no matmul)."""
    n = sum(p.numel() for name, p in model.named_parameters() if "positions" not in name)
    layers = config.n_layers + config.n_decoder_layers
    return 6.0 * n + 12.0 * layers * seq_len * config.q_dim


def measured_peak_flops(device: torch.device, *, size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the best of a few size^3 matmuls on this device with this process's threads."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device).manual_seed(0)  # leaves the global RNG (dropout) untouched
    a = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
