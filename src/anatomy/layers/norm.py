"""Normalisation layers: LayerNorm (mean and variance) and RMSNorm (root mean square only)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.config import ModelConfig


class LayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * weight (+ bias), over the last dimension."""

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension, in one fused op (which
    accumulates in fp32 whatever the input dtype).

    With unit_offset the scale is (1 + weight), in fp32 before the cast back (Gemma): the stored
    weights are offsets from one and start at zero.
    """

    def __init__(self, dim: int, *, eps: float = 1e-6, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        if self.unit_offset:  # Gemma: the scale applied in fp32, then cast back
            return (F.rms_norm(x.float(), self.weight.shape, None, self.eps) * (1.0 + self.weight.float())).to(x.dtype)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def make_norm(config: ModelConfig, dim: int | None = None) -> nn.Module:
    """The norm the config asks for, over `dim` (default d_model)."""
    dim = dim or config.d_model
    if config.norm == "rmsnorm":
        return RMSNorm(dim, eps=config.norm_eps, unit_offset=config.norm_unit_offset)
    return LayerNorm(dim, eps=config.norm_eps, bias=config.norm_bias)
