"""One Transformer block: self-attention, optional cross-attention, FFN, each a residual branch
with its norm before the branch (Pre-Norm: x + f(norm(x))) or after the sum (Post-Norm:
norm(x + f(x)))."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.layers.attention import Attention, LayerCache
from anatomy.layers.context import Context
from anatomy.layers.ffn import make_ffn
from anatomy.layers.norm import make_norm


class Block(nn.Module):
    def __init__(self, config: ModelConfig, *, causal: bool, cross: bool = False, backend: str = "sdpa") -> None:
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.dropout = config.dropout
        self.attn_norm = make_norm(config)
        self.attn = Attention(config, causal=causal, backend=backend)
        self.cross_norm = make_norm(config) if cross else None
        self.cross_attn = Attention(config, cross=True, backend=backend) if cross else None
        self.ffn_norm = make_norm(config)
        self.ffn = make_ffn(config)

    def forward(
        self,
        x: Tensor,
        ctx: Context = Context(),
        *,
        cache: LayerCache | None = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        weights: list[Tensor] | None = None,
    ) -> Tensor:
        """x [B, S, D] -> [B, S, D]. With a `weights` list, the attention weights of this block are
        appended to it: self-attention [B, H, S, S_k], then cross-attention [B, H, S, S_m]."""
        x = self._residual(x, self.attn_norm, lambda h: self._attend(self.attn, weights, h, rope=ctx.rope,
                                                                   mask=ctx.mask, bias=ctx.bias, cache=cache,
                                                                   input_pos=ctx.input_pos))
        if self.cross_attn is not None:
            x = self._residual(x, self.cross_norm, lambda h: self._attend(self.cross_attn, weights, h,
                                                                        memory_kv=memory_kv, mask=ctx.memory_mask))
        return self._residual(x, self.ffn_norm, self.ffn)

    @staticmethod
    def _attend(attn: Attention, weights: list[Tensor] | None, h: Tensor, **kwargs) -> Tensor:
        if weights is None:
            return attn(h, **kwargs)
        out, w = attn(h, return_weights=True, **kwargs)
        weights.append(w)
        return out

    def _residual(self, x: Tensor, norm: nn.Module, branch: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self._drop(branch(norm(x)))
        return norm(x + self._drop(branch(x)))

    def _drop(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.dropout, self.training) if self.dropout else x
