"""Position-wise feed-forward networks: the two-matrix MLP and the gated GLU (SwiGLU, GeGLU)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.config import ModelConfig

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


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
        self.act = ACTIVATIONS[config.activation]
        self.d_ff = d_ff or config.d_ff
        self.gate_up = nn.Linear(config.d_model, 2 * self.d_ff, bias=config.ffn_bias)
        self.down = nn.Linear(self.d_ff, config.d_model, bias=config.ffn_bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).split(self.d_ff, dim=-1)  # [B, S, 2F] -> 2 x [B, S, F]
        return self.down(self.act(gate) * up)  # [B, S, D]


def make_ffn(config: ModelConfig, *, d_ff: int | None = None) -> nn.Module:
    """The dense FFN the config asks for, of width d_ff (default config.d_ff)."""
    return GLU(config, d_ff=d_ff) if config.ffn == "glu" else MLP(config, d_ff=d_ff)


__all__ = ["MLP", "GLU", "make_ffn", "ACTIVATIONS"]
