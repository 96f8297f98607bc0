"""Multi-head latent attention (DeepSeek-V2/V3): keys and values from one cached latent per token.

    x [B, S, D] --q (or q_a, RMSNorm, q_b)--> q [B, S, H, n + r]: n dims without RoPE, r with
             --kv_a--> c [B, S, R] (the latent, RMSNorm'd) and k_r [B, S, r] (one RoPE key, all heads)
    kv_b [H * (n + v), R]: per head W_k [n, R] and W_v [v, R]   (k_n = W_k c, values = W_v c)

The cache holds [c | k_r] per token (R + r values a layer). Attention runs on the latent with the
up-projections absorbed (q_abs = q_n W_k, out = (softmax(scores) c) W_v^T), for prefill and decode
alike, so k_n is never formed. rope_interleaved (DeepSeek) pairs dims (2i, 2i + 1).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.kv_format import Pages
from anatomy.layers.attention import attend, check_backend
from anatomy.layers.norm import RMSNorm
from anatomy.layers.position import apply_rope
from anatomy.layers.segments import Segments


class LatentAttention(nn.Module):
    """Self-attention through a latent (the `Attention` interface of a Block's self-attention)."""

    def __init__(self, config: ModelConfig, *, causal: bool = True, backend: str = "sdpa") -> None:
        super().__init__()
        check_backend(backend)
        H, R, r = config.n_heads, config.kv_lora_rank, config.rotary_dim
        self.n_heads, self.rank, self.rope_dim = H, R, r
        self.nope_dim, self.v_dim = config.head_dim - r, config.v_head_dim or config.head_dim
        self.causal, self.backend, self.reader, self.dropout = causal, backend, None, config.dropout
        self.scale = config.attn_scale if config.attn_scale is not None else config.head_dim ** -0.5
        self.interleaved = config.rope_interleaved
        q_out = H * config.head_dim
        if config.q_lora_rank:
            self.q = None
            self.q_a = nn.Linear(config.d_model, config.q_lora_rank, bias=False)
            self.q_a_norm = RMSNorm(config.q_lora_rank, eps=config.norm_eps)
            self.q_b = nn.Linear(config.q_lora_rank, q_out, bias=False)
        else:
            self.q = nn.Linear(config.d_model, q_out, bias=False)
        self.kv_a = nn.Linear(config.d_model, R + r, bias=False)
        self.kv_a_norm = RMSNorm(R, eps=config.norm_eps)
        self.kv_b = nn.Parameter(torch.empty(H * (self.nope_dim + self.v_dim), R))  # [H (n + v), R]
        nn.init.normal_(self.kv_b, std=0.02)
        self.out = nn.Linear(H * self.v_dim, config.d_model, bias=config.attn_out_bias)

    def forward(self, x: Tensor, *, rope: tuple[Tensor, Tensor] | None = None, mask: Tensor | None = None,
                bias: Tensor | None = None, cache=None, input_pos: Tensor | None = None,
                return_weights: bool = False, memory_kv=None, new_keys_only: bool = False
                ) -> Tensor | tuple[Tensor, Tensor]:
        """x [B, S, D] -> [B, S, D]; rope (cos, sin) [B, S, 1, r]; the cache keeps [c | k_r] as one head."""
        B, S, _ = x.shape
        H, n = self.n_heads, self.nope_dim
        q = (self.q(x) if self.q is not None else self.q_b(self.q_a_norm(self.q_a(x)))).view(B, S, H, -1)
        q_n, q_r = q.split([n, self.rope_dim], dim=-1)  # [B, S, H, n], [B, S, H, r]
        c, k_r = self.kv_a(x).split([self.rank, self.rope_dim], dim=-1)  # [B, S, R], [B, S, r]
        c = self.kv_a_norm(c)
        q_r, k_r = self._rotate(q_r, rope), self._rotate(k_r[:, :, None], rope)  # k_r [B, S, 1, r]
        w = self.kv_b.to(q.dtype).view(H, n + self.v_dim, self.rank)  # the branch dtype of the planned layers
        w_k, w_v = w[:, :n], w[:, n:]  # [H, n, R], [H, v, R]
        q_abs = torch.einsum("bshn,hnr->bhsr", q_n, w_k)  # [B, H, S, R]
        query = torch.cat([q_abs, q_r.transpose(1, 2)], dim=-1)  # [B, H, S, R + r]
        keys = torch.cat([c[:, :, None], k_r], dim=-1).transpose(1, 2)  # [B, 1, S, R + r]
        values = keys[..., :self.rank]  # the latent: the values before W_v
        if cache is not None:
            written, _ = cache.update(input_pos, keys, None)  # [B, 1, T, R + r]
            if not new_keys_only:  # (a fresh prompt reads its new keys: PassInputs.new_keys_only)
                if isinstance(written, Segments):  # a flat batch: each group's keys and latent
                    keys = values = written.map(lambda k, _: _latent(k, self.rank))
                else:
                    keys, values = _latent(written, self.rank)
                mask = cache.keys_mask(mask)
        is_causal = self.causal and mask is None and (cache is None or new_keys_only)
        latent, weights = attend(query, keys, values, mask=mask, bias=bias, is_causal=is_causal,
                                 backend=self.backend, dropout=self.dropout if self.training else 0.0,
                                 return_weights=return_weights, scale=self.scale)  # [B, H, S, R]
        out = torch.einsum("bhsr,hvr->bshv", latent, w_v).reshape(B, S, H * self.v_dim)
        out = self.out(out)
        return (out, weights) if return_weights else out

    def _rotate(self, x: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        """x [B, S, heads, r] rotated; interleaved pairs are taken apart into halves first."""
        if self.interleaved:
            x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
        return apply_rope(x, *rope) if rope is not None else x


def _latent(keys, rank: int) -> tuple[Tensor, Tensor]:
    """A cache's [c | k_r] keys (a paged cache's blocks gathered into rows) and the latent c they hold."""
    keys = keys.gather() if isinstance(keys, Pages) else keys
    return keys, keys[..., :rank]
