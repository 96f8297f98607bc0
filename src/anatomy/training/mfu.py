"""Model FLOPs utilisation: the FLOPs a training step must do, over what the hardware can do.

FLOPs per trained token come from the anatomy module (`analysis.flops.training_flops_per_token`:
3 x the matmuls of a forward pass, attention included, about 6N + 12·L·T·D for a decoder). The peak
is measured here: a large fp32 (bf16 on GPU) matmul with this process's threads.
"""

from __future__ import annotations

import time

import torch

from anatomy.analysis.flops import training_flops_per_token
from anatomy.config import ModelConfig


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token the model reads. The analysis counts a seq2seq forward per target
    token with as many source tokens; a token here is either one, hence the half."""
    per_token = training_flops_per_token(config, seq=seq_len)["three_forward"]
    return per_token / 2 if config.is_seq2seq else per_token


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
