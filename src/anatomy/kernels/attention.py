"""The engine view's decode attention over a float KV cache: SDPA or anatomy's kernel, measured.

    reader = decode_reader(config, dtype)     native.read_cache, or None (SDPA stays)

A decode step's attention is a few query rows over the whole cache: torch's SDPA on a CPU spends most
of it outside the arithmetic (~40 us a layer for SmolLM2 at 256 slots). anatomy::decode_attention
(kernels/native/attention.cpp) reads the cache as stored, float32 or bfloat16 alike. Which is faster
depends on the machine, so both are timed once per process on the model's decode shape (one query
position, BUCKET slots, the cache in the branches' dtype) and the native kernel is used only where it
wins; without the native library, SDPA stays.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

from anatomy.config import ModelConfig
from anatomy.kernels import native
from anatomy.layers.attention import READABLE

SLOTS = 256  # the cache length timed (the engine's BUCKET: the shortest cache a captured step sees)
CALLS = 30


def decode_reader(config: ModelConfig, dtype: torch.dtype):
    """native.read_cache where it measures faster than SDPA on this model's decode shape, else None."""
    if not native.loaded() or dtype not in READABLE:
        return None
    if _native_faster(config.n_heads, config.n_kv_heads, config.head_dim, dtype):
        return native.read_cache
    return None


@functools.cache
def _native_faster(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, 1, head_dim, generator=g).to(dtype)
    k, v = (torch.randn(1, kv_heads, SLOTS, head_dim, generator=g).to(dtype) for _ in range(2))
    mask = torch.zeros(1, 1, 1, SLOTS, dtype=dtype)
    rep = heads // kv_heads
    folded = q.reshape(1, kv_heads, rep, head_dim)
    scale = head_dim ** -0.5

    def sdpa():
        F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, scale=scale)

    def own():
        native.read_cache(q, k, v, mask=mask, scale=scale)

    return _seconds(own) < _seconds(sdpa)


def _seconds(fn) -> float:
    """The fastest of three rounds of CALLS calls, per call."""
    with torch.inference_mode():
        fn()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(CALLS):
                fn()
            best = min(best, (time.perf_counter() - start) / CALLS)
    return best
