"""The engine view's attention: SDPA or anatomy's kernel, measured, for a decode step over a float KV
cache and for a prompt over its own keys.

    reader = decode_reader(config, dtype)     native.read_cache, or None (SDPA stays)
    reader = paged_reader(config, dtype)      the same over a paged pool (Pages), or None (gather + SDPA)
    causal = prompt_attention(config, dtype)  native.causal, or None (SDPA's is_causal stays)

A decode step's attention is a few query rows over the whole cache, where torch's SDPA on a CPU spends
most of its time outside the arithmetic. anatomy::decode_attention (kernels/native/attention.cpp) reads
the cache as stored (float32, bfloat16 or float16). Which is faster depends on the machine, so both are
timed once on the model's decode shape (kept by kernels/decisions.py) and the native kernel is used
only where it wins. Over a paged pool the race is between reading the blocks where they lie and
gathering each row's blocks into a copy for SDPA. A prompt's causal attention (anatomy::causal_attention)
reads keys only up to each tile of rows' last. Figures: docs/inference.md, "The measured kernel plan".
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from anatomy.config import ModelConfig
from anatomy.kernels import native
from anatomy.kernels.decisions import decided
from anatomy.kv_format import Pages
from anatomy.layers.attention import READABLE

PROMPT = 512  # the prompt length timed for a prompt's attention
SLOTS = 256  # the cache length timed (the engine's BUCKET: the shortest cache a captured step sees)
BLOCK = 16  # the block size of the paged pool timed (the server's default)
CALLS = 30


def decode_reader(config: ModelConfig, dtype: torch.dtype, *, cache: bool | str | Path = True):
    """native.read_cache where it measured faster than SDPA on this model's decode shape, else None."""
    return _reader_if_faster(config, dtype, paged=False, cache=cache)


def paged_reader(config: ModelConfig, dtype: torch.dtype, *, cache: bool | str | Path = True):
    """native.read_cache where reading a paged pool in place measured faster than gathering each row's
    blocks for SDPA on this model's decode shape, else None."""
    return _reader_if_faster(config, dtype, paged=True, cache=cache)


def prompt_attention(config: ModelConfig, dtype: torch.dtype, *, cache: bool | str | Path = True):
    """native.causal where it measured faster than SDPA's causal kernel on this model's prompt shape (float32
    branches only; head dims up to native.CAUSAL_MAX_DIM), else None."""
    if not native.loaded() or dtype != torch.float32 or config.head_dim > native.CAUSAL_MAX_DIM:
        return None
    shape = (config.n_heads, config.n_kv_heads, config.head_dim)
    if decided("native_prompt_attention", {"shape": shape, "rows": PROMPT}, cache=cache,
               measure=lambda: _causal_faster(*shape)):
        return native.causal
    return None


def _causal_faster(heads: int, kv_heads: int, head_dim: int) -> bool:
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(1, PROMPT, heads + 2 * kv_heads, head_dim, generator=g).transpose(1, 2)  # as a layer's views
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    scale = head_dim ** -0.5

    def sdpa():
        F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=heads != kv_heads)

    def own():
        native.causal(q, k, v, scale=scale)

    return _seconds(own, calls=3) < _seconds(sdpa, calls=3)


def _reader_if_faster(config: ModelConfig, dtype: torch.dtype, *, paged: bool, cache: bool | str | Path):
    if not native.loaded() or dtype not in READABLE:
        return None
    shape = (config.n_heads, config.n_kv_heads, config.head_dim)
    depends_on = {"shape": shape, "dtype": str(dtype), "paged": paged}
    if decided("native_attention", depends_on, cache=cache,
               measure=lambda: _native_faster(*shape, dtype, paged, native.isa())):
        return native.read_cache
    return None


def _native_faster(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, paged: bool, isa: str) -> bool:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, 1, head_dim, generator=g).to(dtype)
    if paged:  # the slots in blocks of 16 of a larger pool, scattered
        pools = [torch.randn(4 * SLOTS // BLOCK, BLOCK, kv_heads, head_dim, generator=g).to(dtype) for _ in range(2)]
        tables = torch.randperm(4 * SLOTS // BLOCK, generator=g)[None, :SLOTS // BLOCK]
        k, v = (Pages(pool, tables) for pool in pools)
    else:
        k, v = (torch.randn(1, kv_heads, SLOTS, head_dim, generator=g).to(dtype) for _ in range(2))
    mask = torch.zeros(1, 1, 1, SLOTS, dtype=dtype)
    rep = heads // kv_heads
    folded = q.reshape(1, kv_heads, rep, head_dim)
    scale = head_dim ** -0.5

    def sdpa():
        keys, values = (k.gather(), v.gather()) if paged else (k, v)
        F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scale)

    def own():
        native.read_cache(q, k, v, mask=mask, scale=scale)

    return _seconds(own) < _seconds(sdpa)


def _seconds(fn, calls: int = CALLS) -> float:
    """The fastest of three rounds of `calls` calls, per call."""
    with torch.inference_mode():
        fn()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - start) / calls)
    return best
