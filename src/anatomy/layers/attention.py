"""Multi-head attention: MHA, GQA and MQA, self- and cross-attention, two backends.

    x [B, S, D] --qkv--> q [B, H, S, d_h], k/v [B, H_kv, S_k, d_h]   (optional q/k norm, RoPE, a KV cache)
    out = softmax(q k^T / sqrt(d_h) [+ ALiBi, soft cap, mask, sinks]) v  --out--> [B, S, D]

With GQA the query heads of a group are folded into the sequence axis rather than k/v being copied.
An 8-bit KV cache gives its keys and values as `Codes` (anatomy/kv_format.py): a step of a few query
rows reads them through the cache's `reader` (kernels/native/attention.cpp), anything else turns
them into floats; a float cache is read the same way when the layer has a `reader`.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.kv_format import Codes, Pages
from anatomy.layers.norm import RMSNorm
from anatomy.layers.position import apply_rope
from anatomy.layers.segments import Segments

BACKENDS = ("sdpa", "eager")
READ_ROWS = 16  # query rows per KV head up to which a cache's reader attends (decode, verification)
READABLE = (torch.float32, torch.bfloat16, torch.float16)  # the float caches a reader reads as stored


class LayerCache(Protocol):
    """What attention needs from a KV cache: write k/v at input_pos, get back the keys and values to
    attend over, and the pass's mask (over cache slots) over those keys."""

    max_len: int

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...

    def keys_mask(self, mask: Tensor | None) -> Tensor | None: ...


class Attention(nn.Module):
    """Self-attention (fused QKV projection) or cross-attention (Q from x, fused KV from memory).

    `backend` is fixed at construction: "sdpa" (PyTorch's fused kernels) or "eager" (the score
    matrix as its own tensor, for shape traces and memory measurements). Attention weights asked
    for with return_weights=True always come from the eager path.
    """

    def __init__(self, config: ModelConfig, *, causal: bool = False, cross: bool = False,
                 backend: str = "sdpa") -> None:
        super().__init__()
        check_backend(backend)
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.causal, self.cross = causal, cross
        self.backend = backend
        self.reader = None  # attention of a few query rows over a float cache as stored (set by an engine's view)
        self.causal_kernel = None  # a prompt's causal attention over its own keys (set by an engine's view)
        self.dropout = config.dropout
        self.scale, self.softcap = config.attn_scale, config.attn_softcap
        q_dim, kv_dim = config.q_dim, config.kv_dim
        if cross:
            self.q = nn.Linear(config.d_model, q_dim, bias=config.qkv_bias)
            self.kv = nn.Linear(config.d_model, 2 * kv_dim, bias=config.qkv_bias)
        else:
            self.qkv = nn.Linear(config.d_model, q_dim + 2 * kv_dim, bias=config.qkv_bias)
        self.out = nn.Linear(q_dim, config.d_model, bias=config.attn_out_bias)
        self.sinks = nn.Parameter(torch.zeros(config.n_heads)) if config.attn_sinks else None  # [H]
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.norm_eps, unit_offset=config.norm_unit_offset)
            self.k_norm = RMSNorm(self.head_dim, eps=config.norm_eps, unit_offset=config.norm_unit_offset)

    def forward(
        self,
        x: Tensor,
        *,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        cache: LayerCache | None = None,
        input_pos: Tensor | None = None,
        return_weights: bool = False,
        new_keys_only: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x [B, S, D]; rope (cos, sin) [B, S, 1, d_h]; mask [B|1, 1, S, S_k], bool (True attends) or
        float (added to the scores); bias [B|1, H, S, S_k].

        With no mask, a causal layer without a cache masks the future itself, and so does one whose
        pass is a fresh prompt (`new_keys_only`: the cache is written, the new keys are read).
        """
        B, S, _ = x.shape
        if self.cross:
            q = self.q(x).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, S, d_h]
            k, v = memory_kv if memory_kv is not None else self.project_memory(x)
        else:
            q, k, v = self._project_self(x, rope)
        if cache is not None:
            written = cache.update(input_pos, k, v)  # [B, H_kv, T, d_h]
            if not new_keys_only:
                (k, v), mask = written, cache.keys_mask(mask)
        is_causal = self.causal and mask is None and (cache is None or new_keys_only)
        out, weights = attend(
            q, k, v, mask=mask, bias=bias, is_causal=is_causal, backend=self.backend,
            dropout=self.dropout if self.training else 0.0, return_weights=return_weights,
            scale=self.scale, softcap=self.softcap, reader=self.reader if cache is not None else None,
            sinks=self.sinks, causal_kernel=self.causal_kernel,
        )
        out = self.out(out.transpose(1, 2).reshape(B, S, -1))  # [B, H, S, d_h] -> [B, S, H*d_h] -> [B, S, D]
        return (out, weights) if return_weights else out

    def _project_self(self, x: Tensor, rope: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, H, S, d_h], k and v [B, H_kv, S, d_h] from one fused projection; q and k rotated together."""
        B, S, _ = x.shape
        H, H_kv = self.n_heads, self.n_kv_heads
        qkv = self.qkv(x).view(B, S, H + 2 * H_kv, self.head_dim)  # [B, S, H + 2*H_kv, d_h]
        qk, v = qkv.split([H + H_kv, H_kv], dim=2)
        if self.q_norm is not None:  # RMSNorm of each q and k head, before RoPE
            q, k = qk.split([H, H_kv], dim=2)
            qk = torch.cat([self.q_norm(q), self.k_norm(k)], dim=2)
        if rope is not None:
            qk = apply_rope(qk, *rope)
        q, k = qk.split([H, H_kv], dim=2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, S, d_h]

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder output [B, S_m, D], computed once."""
        B, S_m, _ = memory.shape
        kv = self.kv(memory).view(B, S_m, 2, self.n_kv_heads, self.head_dim)  # [B, S_m, 2, H_kv, d_h]
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # 2 x [B, H_kv, S_m, d_h]
        return k, v


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    backend: str = "sdpa",
    dropout: float = 0.0,
    return_weights: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    reader=None,
    sinks: Tensor | None = None,
    causal_kernel=None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T * scale + bias, masked) v for q [B, H, S, d_h] and k/v [B, H_kv, S_k, d_h];
    scale defaults to 1/sqrt(d_h). A softcap (cap * tanh(scores / cap), before bias and mask) has no
    fused kernel: the scores are computed as a tensor.

    mask [B|1, 1, S, S_k] is bool (True attends) or float (added to the scores). k and v may be Codes
    (an 8-bit cache's) or Pages (a paged cache's blocks, S_k = nb * bs), each with its own reader, or k
    Segments (a flat batch's groups, q [1, H, T, d_h], each group with its own keys, mask and bias).
    `reader` reads float k and v as stored, for a few query rows (kernels/native). `sinks` [H]: a
    logit per head that joins each row's softmax with no value (computed as a tensor, as a softcap).
    `causal_kernel(q, k, v, scale=)` computes a causal pass of float32 rows over their own keys in its stead
    (kernels/native: anatomy::causal_attention)."""
    check_backend(backend)
    if isinstance(k, Segments):  # a flat batch (layers/segments.py): each group of rows attends apart
        if return_weights or is_causal:
            raise InputError("a flat batch of segments gives no attention weights and has its own masks")
        return k.attend(q, lambda q, k, v, mask, bias, causal: attend(
            q, k, v, mask=mask, bias=bias, is_causal=causal, backend=backend, dropout=dropout, scale=scale,
            softcap=softcap, reader=reader, sinks=sinks, causal_kernel=causal_kernel)), None
    if mask is not None and not isinstance(k, Pages):  # a pass over the cache's first slots only
        k, v = first_slots(k, mask.shape[-1]), first_slots(v, mask.shape[-1])
    readable = (bias is None and softcap is None and sinks is None and not return_weights and not dropout
                and not is_causal and q.shape[2] <= READ_ROWS
                and (mask is None or mask.dtype != torch.bool))
    reader = k.reader if isinstance(k, (Codes, Pages)) else reader
    if isinstance(k, Pages) and not (readable and reader is not None and k.pool.dtype in READABLE):
        k, v = k.gather(), v.gather()  # a paged cache's blocks, copied into rows
    if readable and reader is not None and (isinstance(k, (Codes, Pages)) or k.dtype in READABLE):
        return reader(q, k, v, mask=mask, scale=scale if scale is not None else q.shape[-1] ** -0.5), None
    if isinstance(k, Codes):
        k, v = k.dequantize(q.dtype), v.dequantize(q.dtype)
    elif k.dtype != q.dtype:  # a float cache in another dtype than the branches compute in (kv_dtype=...)
        k, v = k.to(q.dtype), v.to(q.dtype)
    B, H, S, d_h = q.shape
    H_kv, S_k = k.shape[1], k.shape[2]
    rep = H // H_kv
    explicit = softcap is not None or sinks is not None  # no fused kernel: the scores as a tensor
    # a causal pass over its own keys with nothing added to the scores: one fused kernel takes it whole
    fused_causal = is_causal and backend == "sdpa" and S == S_k and mask is None and bias is None \
        and not return_weights and not explicit
    if fused_causal and causal_kernel is not None and q.dtype == torch.float32 and not dropout:
        return causal_kernel(q, k, v, scale=scale if scale is not None else d_h ** -0.5), None
    if fused_causal and rep > 1:
        # the query heads of each kv group read its keys in the kernel (enable_gqa): no mask, no folding
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=True)
        return out, None
    if is_causal and (rep > 1 or backend == "eager" or bias is not None or return_weights or explicit):
        mask = torch.ones(S, S_k, dtype=torch.bool, device=q.device).tril(S_k - S)[None, None]
        is_causal = False
    if rep > 1:  # fold the query heads of each kv group into the sequence axis
        q = q.reshape(B, H_kv, rep * S, d_h)
        if mask is not None and mask.shape[-2] > 1:  # a [B, 1, 1, S_k] padding mask broadcasts as is
            mask = mask.repeat(1, 1, rep, 1)  # [B|1, 1, rep*S, S_k]
        bias = bias.reshape(bias.shape[0], H_kv, rep * S, S_k) if bias is not None else None
    if backend == "sdpa" and not return_weights and not explicit:
        attn_mask = mask if bias is None else _with_bias(mask, bias, q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=is_causal,
                                             scale=scale)
        weights = None
    else:
        scores = q @ k.transpose(-2, -1)  # [B, H_kv, rep*S, S_k]
        scores = scores * scale if scale is not None else scores / math.sqrt(d_h)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if bias is not None:
            scores = scores + bias
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        weights = scores.softmax(dim=-1) if sinks is None else _with_sinks(scores, sinks, S)
        out = F.dropout(weights, dropout) @ v if dropout else weights @ v  # [B, H_kv, rep*S, d_h]
        weights = weights.reshape(B, H, S, S_k)
    return out.reshape(B, H, S, v.shape[-1]), weights  # (latent attention: values narrower than keys)


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise InputError(f"attention backend={backend!r} is not one of {', '.join(map(repr, BACKENDS))}")
    return backend


def first_slots(x: Tensor | Codes, n: int) -> Tensor | Codes:
    """A cache's keys or values [B, H_kv, T, d_h] (or Codes) limited to the first n slots (a view)."""
    slots = x.codes.shape[2] if isinstance(x, Codes) else x.shape[2]
    if slots <= n:
        return x
    if isinstance(x, Codes):
        return Codes(x.codes[:, :, :n], x.scale[:, :, :n], x.lut, x.reader)
    return x[:, :, :n]


def _with_sinks(scores: Tensor, sinks: Tensor, S: int) -> Tensor:
    """softmax over [scores, the head's sink] without the sink's column: scores [B, H_kv, rep*S, S_k]
    (query heads folded into rows, head h = kv group * rep + r), sinks [H]."""
    H_kv, rows = scores.shape[1], scores.shape[2]
    sink = sinks.to(scores.dtype).view(H_kv, -1, 1).expand(H_kv, rows // S, S).reshape(1, H_kv, rows, 1)
    joined = torch.cat([scores, sink.expand(scores.shape[0], -1, -1, -1)], dim=-1)
    return joined.softmax(dim=-1)[..., :-1]


def _with_bias(mask: Tensor | None, bias: Tensor, dtype: torch.dtype) -> Tensor:
    """One additive float mask: the bias, -inf where a bool mask forbids, plus a float mask."""
    bias = bias.to(dtype)
    if mask is None:
        return bias
    return bias.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else bias + mask
