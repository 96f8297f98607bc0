"""Positional information: sinusoidal and learned tables (added to the embeddings), rotary
embeddings (RoPE, rotating Q and K), and ALiBi (a per-head linear bias on the attention scores)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.layers.rope_scaling import dynamic_frequencies, long_frequencies, static_frequencies


def sinusoidal_table(n_positions: int, dim: int) -> Tensor:
    """[n_positions, dim] on the CPU: sin in the first half, cos in the second, frequency 1/10000^(2i/dim).

    The frequencies are those of Vaswani et al.; the halves are concatenated rather than
    interleaved (as in tensor2tensor and Marian), which is the same table up to a fixed
    permutation of the dimensions.
    """
    pos = torch.arange(n_positions, dtype=torch.float64, device="cpu")[:, None]  # [T, 1]
    inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim)  # [D/2]
    angles = pos * inv_freq  # [T, D/2]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).float()  # [T, D]


class SinusoidalPositions(nn.Module):
    """A fixed table, looked up by position id; not a parameter and not saved."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_positions, self.dim = config.max_seq_len, config.d_model
        self.register_buffer("table", torch.empty(0), persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)compute the table on the CPU: also after a build on the meta device."""
        self.table = sinusoidal_table(self.n_positions, self.dim)

    def forward(self, position_ids: Tensor) -> Tensor:
        return self.table[position_ids]  # [B, S] -> [B, S, D]


class LearnedPositions(nn.Module):
    """A trained table of max_seq_len vectors (BERT, GPT-2)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.max_seq_len, config.d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, position_ids: Tensor) -> Tensor:
        return self.weight[position_ids]  # [B, S] -> [B, S, D]


class Rotary(nn.Module):
    """RoPE in the half-split layout of HF transformers: dimension i pairs with i + d/2, over the
    first d = rotary_dim dims of each head (the rest pass through), with the config's scaling rule
    (layers/rope_scaling.py). `sliding`: the sliding-window layers' own base and scaling (Gemma 3)."""

    def __init__(self, config: ModelConfig, *, sliding: bool = False) -> None:
        super().__init__()
        self.dim = config.rotary_dim
        if sliding:
            self.theta, self.scaling = config.sliding_rope_theta, config.sliding_rope_scaling
        else:
            self.theta, self.scaling = config.rope_theta, config.rope_scaling
        self.attention_factor = 1.0
        self.register_buffer("inv_freq", torch.empty(0), persistent=False)
        self.register_buffer("long_inv_freq", None, persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)compute the inverse frequencies [d/2] on the CPU: also after a build on meta."""
        self.inv_freq, self.attention_factor = static_frequencies(self.theta, self.dim, self.scaling)
        if self.scaling is not None and self.scaling.kind == "longrope":
            self.long_inv_freq = long_frequencies(self.theta, self.dim, self.scaling)

    def forward(self, position_ids: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """(cos, sin), each [B, S, 1, d] in `dtype`, of the angles of position_ids [B, S]: they
        broadcast over the heads of q and k laid out [B, S, heads, d_h]."""
        angles = position_ids[..., None].float() * self._frequencies(position_ids)  # [B, S, d/2]
        angles = torch.cat([angles, angles], dim=-1)[:, :, None]  # [B, S, 1, d]
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

    @property
    def length_dependent(self) -> bool:
        """Do the frequencies depend on how far a pass reaches (dynamic NTK, LongRoPE)?"""
        return self.scaling is not None and self.scaling.kind in ("dynamic", "longrope")

    def _frequencies(self, position_ids: Tensor) -> Tensor:
        """[d/2]; the length-dependent rules read how far this pass reaches (largest position + 1)."""
        if not self.length_dependent:
            return self.inv_freq
        length = position_ids.max() + 1
        if self.scaling.kind == "dynamic":
            return dynamic_frequencies(self.theta, self.dim, self.scaling, length)
        return torch.where(length > self.scaling.original_max_seq_len, self.long_inv_freq, self.inv_freq)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [..., d_h] by the angles cos/sin [..., d] (broadcastable to x): x * cos + rotate_half(x) * sin,
    where rotate_half pairs dimension i with i + d/2: (x1, x2) -> (-x2, x1). With d < d_h (partial
    rotary) the first d dims rotate and the others pass through."""
    if cos.dtype != x.dtype:  # angles made in the residual stream's dtype, q and k in the branches'
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    d = cos.shape[-1]
    if d < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :d], cos, sin), x[..., d:]], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def alibi_slopes(n_heads: int) -> Tensor:
    """Press et al. 2021: a geometric series 2^(-8/n), 2^(-16/n), ... per head; for a head count
    that is not a power of two, the slopes of the next lower power plus every other one above."""
    def series(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    low = 2 ** math.floor(math.log2(n_heads))
    slopes = series(low)
    if low < n_heads:
        slopes += series(2 * low)[0::2][: n_heads - low]
    return torch.tensor(slopes, device="cpu")


def alibi_bias(slopes: Tensor, q_pos: Tensor, k_pos: Tensor, *, causal: bool) -> Tensor:
    """Additive bias -slope * distance (|distance| when not causal) of queries at q_pos [S_q] (or
    [B, S_q], rows apart) and keys at k_pos [S_k] -> [1, H, S_q, S_k] (or [B, H, S_q, S_k]), float32."""
    distance = (q_pos[..., :, None] - k_pos).float()  # [(B,) S_q, S_k]
    if not causal:
        distance = distance.abs()
    bias = -slopes.float()[:, None, None] * distance[..., None, :, :]  # [(B,) H, S_q, S_k]
    return bias if bias.dim() == 4 else bias[None]
