"""One Transformer block: self-attention, optional cross-attention, FFN, each a residual branch
with its norm before the branch (Pre-Norm: x + f(norm(x))) or after the sum (Post-Norm:
norm(x + f(x)))."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.layers.attention import Attention, LayerCache
from anatomy.layers.ffn import make_ffn
from anatomy.layers.norm import make_norm


class Block(nn.Module):
    def __init__(self, config: ModelConfig, *, causal: bool, cross: bool = False) -> None:
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.dropout = config.dropout
        self.attn_norm = make_norm(config)
        self.attn = Attention(config, causal=causal)
        self.cross_norm = make_norm(config) if cross else None
        self.cross_attn = Attention(config, cross=True) if cross else None
        self.ffn_norm = make_norm(config)
        self.ffn = make_ffn(config)

    def forward(
        self,
        x: Tensor,
        *,
        rope: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        cache: LayerCache | None = None,
        input_pos: Tensor | None = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        memory_mask: Tensor | None = None,
    ) -> Tensor:
        """x [B, S, D] -> [B, S, D]."""
        x = self._residual(x, self.attn_norm, lambda h: self.attn(
            h, rope=rope, mask=mask, bias=bias, cache=cache, input_pos=input_pos))
        if self.cross_attn is not None:
            x = self._residual(x, self.cross_norm, lambda h: self.cross_attn(h, memory_kv=memory_kv, mask=memory_mask))
        return self._residual(x, self.ffn_norm, self.ffn)

    def _residual(self, x: Tensor, norm: nn.Module, branch: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self._drop(branch(norm(x)))
        return norm(x + self._drop(branch(x)))

    def _drop(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.dropout, self.training) if self.dropout else x
