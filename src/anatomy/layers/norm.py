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
    accumulates in fp32 whatever the input dtype)."""

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def make_norm(config: ModelConfig, dim: int | None = None) -> nn.Module:
    """The norm the config asks for, over `dim` (default d_model)."""
    dim = dim or config.d_model
    if config.norm == "rmsnorm":
        return RMSNorm(dim, eps=config.norm_eps)
    return LayerNorm(dim, eps=config.norm_eps, bias=config.norm_bias)
