"""Position-wise feed-forward networks: the two-matrix MLP and the gated GLU (SwiGLU, GeGLU, and
gpt-oss's clamped SwiGLU: gate <= L, -L <= up <= L, gate * sigmoid(alpha * gate) * (up + 1))."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.config import ModelConfig

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def gating(config: ModelConfig) -> Callable[[Tensor, Tensor], Tensor]:
    """(gate, up) -> the GLU's hidden activations: act(gate) * up, or the clamped SwiGLU."""
    if config.swiglu_limit is None:
        act = ACTIVATIONS[config.activation]
        return lambda gate, up: act(gate) * up
    limit, alpha = config.swiglu_limit, config.swiglu_alpha

    def clamped(gate: Tensor, up: Tensor) -> Tensor:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        return gate * torch.sigmoid(gate * alpha) * (up + 1)

    return clamped


class MLP(nn.Module):
    """down(act(up(x))): D -> F -> D (the original Transformer, BERT, GPT-2)."""

    def __init__(self, config: ModelConfig, *, d_ff: int | None = None) -> None:
        super().__init__()
        d_ff = d_ff or config.d_ff
        self.act = ACTIVATIONS[config.activation]
        self.up = nn.Linear(config.d_model, d_ff, bias=config.ffn_bias)
        self.down = nn.Linear(d_ff, config.d_model, bias=config.ffn_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))  # [B, S, D] -> [B, S, F] -> [B, S, D]


class GLU(nn.Module):
    """down(act(gate(x)) * up(x)), with gate and up fused into one [2F, D] matmul."""

    def __init__(self, config: ModelConfig, *, d_ff: int | None = None) -> None:
        super().__init__()
        self.act, self.clamp = ACTIVATIONS[config.activation], config.swiglu_limit
        self.gated = gating(config)
        self.d_ff = d_ff or config.d_ff
        self.gate_up = nn.Linear(config.d_model, 2 * self.d_ff, bias=config.ffn_bias)
        self.down = nn.Linear(self.d_ff, config.d_model, bias=config.ffn_bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).split(self.d_ff, dim=-1)  # [B, S, 2F] -> 2 x [B, S, F]
        return self.down(self.gated(gate, up))  # [B, S, D]


def make_ffn(config: ModelConfig, *, d_ff: int | None = None) -> nn.Module:
    """The dense FFN the config asks for, of width d_ff (default config.d_ff)."""
    return GLU(config, d_ff=d_ff) if config.ffn == "glu" else MLP(config, d_ff=d_ff)


__all__ = ["MLP", "GLU", "make_ffn", "gating", "ACTIVATIONS"]
