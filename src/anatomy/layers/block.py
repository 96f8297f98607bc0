"""One Transformer block: self-attention, optional cross-attention, FFN, each a residual branch
with its norm before the branch (Pre-Norm: x + f(norm(x))) or after the sum (Post-Norm:
norm(x + f(x))); with branch_output_norm also a norm on the branch's output (x + norm2(f(norm(x))),
Gemma 2's "sandwich").

Which block of the stack it is (`layer`) decides the per-layer choices of the config: whether its
self-attention looks through the sliding window and by which RoPE angles it rotates (none: NoPE),
whether its FFN is a mixture of experts."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.layers.attention import Attention, LayerCache
from anatomy.layers.pass_inputs import PassInputs
from anatomy.layers.ffn import make_ffn
from anatomy.layers.latent_attention import LatentAttention
from anatomy.layers.moe import MoE
from anatomy.layers.norm import make_norm


class Block(nn.Module):
    def __init__(self, config: ModelConfig, *, causal: bool, cross: bool = False, backend: str = "sdpa",
                 layer: int = 0) -> None:
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.dropout = config.dropout
        self.window = config.layer_window(layer) if causal else None
        self.rope = config.layer_rope(layer)  # "main", "sliding" (the window's own base) or "none" (NoPE)
        self.attn_norm = make_norm(config)
        if config.latent:
            self.attn = LatentAttention(config, causal=causal, backend=backend)
        else:
            self.attn = Attention(config, causal=causal, backend=backend)
        self.attn_out_norm = make_norm(config) if config.branch_output_norm else None
        self.cross_norm = make_norm(config) if cross else None
        self.cross_attn = Attention(config, cross=True, backend=backend) if cross else None
        self.ffn_norm = make_norm(config)
        self.moe = config.layer_is_moe(layer)
        self.ffn = MoE(config) if self.moe else make_ffn(config)
        self.ffn_out_norm = make_norm(config) if config.branch_output_norm else None

    def forward(
        self,
        x: Tensor,
        ctx: PassInputs = PassInputs(),
        *,
        cache: LayerCache | None = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        weights: list[Tensor] | None = None,
    ) -> Tensor:
        """x [B, S, D] -> [B, S, D]. With a `weights` list, the attention weights of this block are
        appended to it: self-attention [B, H, S, S_k], then cross-attention [B, H, S, S_m]."""
        mask = ctx.window_mask if self.window is not None and ctx.window_mask is not None else ctx.mask
        rope = {"main": ctx.rope, "sliding": ctx.sliding_rope, "none": None}[self.rope]
        x = self._residual(x, self.attn_norm, lambda h: self._attend(self.attn, weights, h, rope=rope,
                                                                   mask=mask, bias=ctx.bias, cache=cache,
                                                                   input_pos=ctx.input_pos,
                                                                   new_keys_only=ctx.new_keys_only),
                          self.attn_out_norm)
        if self.cross_attn is not None:
            x = self._residual(x, self.cross_norm, lambda h: self._attend(self.cross_attn, weights, h,
                                                                        memory_kv=memory_kv, mask=ctx.memory_mask))
        ffn = (lambda h: self.ffn(h, ctx.router_logits)) if self.moe else self.ffn
        return self._residual(x, self.ffn_norm, ffn, self.ffn_out_norm)

    @staticmethod
    def _attend(attn: Attention, weights: list[Tensor] | None, h: Tensor, **kwargs) -> Tensor:
        if weights is None:
            return attn(h, **kwargs)
        out, w = attn(h, return_weights=True, **kwargs)
        weights.append(w)
        return out

    def _residual(self, x: Tensor, norm: nn.Module, branch: Callable[[Tensor], Tensor],
                  out_norm: nn.Module | None = None) -> Tensor:
        if self.pre_norm:
            h = branch(norm(x))
            return x + self._drop(out_norm(h) if out_norm is not None else h)
        return norm(x + self._drop(branch(x)))

    def _drop(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.dropout, self.training) if self.dropout else x
