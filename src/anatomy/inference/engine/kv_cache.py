"""The static KV cache: per layer, K and V preallocated as [B, H_kv, T_max, d_h] and written in
place at the slots `input_pos` names; a sliding-window layer keeps a ring of its window's slots instead
(window_cache.py) when that is shorter. One layer's cache is layer_cache.LayerKVCache.

Nothing is ever appended or reallocated, so every decode step sees the same shapes (the step can
be compiled) and the memory is known up front: 2 * L * B * H_kv * T_max * d_h * bytes-per-value.
With GQA only the H_kv key/value heads are stored, never the H query heads.

An 8-bit cache (`kv_dtype` int8, fp8_e4m3 or fp8_e5m2; anatomy/kv_format.py) stores codes [B, H_kv, T,
d_h] and a float16 scale per token and head [B, H_kv, T]; `update` then returns the keys and values as
`Codes` (kv_format.py), which attention reads as they are (`reader`: kernels/native/attention.cpp) or
turns into floats.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy import dtypes, kv_format
from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.inference.engine.layer_cache import LayerKVCache
from anatomy.inference.engine.window_cache import SLACK, WindowKVCache

__all__ = ["KVCache", "LayerKVCache", "bytes_per_token"]


class KVCache(nn.ModuleList):
    """The caches of all L layers of a stack: model(..., cache=KVCache(...), input_pos=...);
    `codes` ("int8", "fp8_e4m3", "fp8_e5m2") stores 8-bit codes with scales instead of `dtype`, and
    `reader` is the attention that reads them as stored (None: they are turned into floats). A
    sliding-window layer keeps a ring of window + `slack` slots (window_cache.py) where that is shorter."""

    def __init__(self, config: ModelConfig, *, batch: int, max_len: int, n_layers: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 codes: str | None = None, reader=None, slack: int | None = None) -> None:
        slack = SLACK if slack is None else slack

        n_layers = n_layers if n_layers is not None else config.cached_layers
        layer = dict(batch=batch, n_kv_heads=config.n_kv_heads, head_dim=config.head_dim, dtype=dtype, device=device,
                     codes=codes, reader=reader)
        if config.latent:  # one "head" per token: the latent and the RoPE key
            if codes:
                raise InputError(f"kv_dtype={codes!r}: a latent-attention cache (kv_lora_rank="
                                 f"{config.kv_lora_rank}) holds floats only")
            layer.update(n_kv_heads=1, head_dim=config.kv_values_per_layer, keys_only=True)
        windows = [config.layer_window(i) if config.is_decoder else None for i in range(n_layers)]
        super().__init__(
            WindowKVCache(window=window, max_len=max_len, slack=slack, **layer) if window and window + slack < max_len
            else LayerKVCache(max_len=max_len, **layer)
            for window in windows)
        self.max_len, self.dtype, self.kind = max_len, dtype, codes
        self.owner = None  # a weak reference to the run the engine lent this cache to

    def reorder(self, rows: Tensor) -> None:
        for layer in self:
            layer.reorder(rows)

    @property
    def rewind_limit(self) -> int:
        """The most slots a run may take back: a ring keeps `slack` slots beyond its window (else T_max)."""
        return min((getattr(layer, "slack", self.max_len) for layer in self), default=self.max_len)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self)


def bytes_per_token(config: ModelConfig, dtype: torch.dtype | str = torch.float32) -> int:
    """Cache bytes one token costs (a KV dtype name or a float torch dtype), scales included."""
    return kv_format.kv_bytes_per_token(config, dtypes.name_of(dtype) if isinstance(dtype, torch.dtype) else dtype)
