"""The static KV cache: per layer, K and V preallocated as [B, H_kv, T_max, d_h] and written in
place at the slots `input_pos` names; a sliding-window layer keeps a ring of its window's slots instead
(window_cache.py) when that is shorter.

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
from anatomy.kv_format import Codes
from anatomy.config import ModelConfig
from anatomy.errors import InputError


class LayerKVCache(nn.Module):
    """One layer's keys and values; `update` writes the new ones and returns all T_max slots."""

    def __init__(self, *, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 codes: str | None = None, reader=None, keys_only: bool = False) -> None:
        super().__init__()
        self.max_len, self.kind, self.reader = max_len, codes, reader
        shape = (batch, n_kv_heads, max_len, head_dim)
        stored = kv_format.code_dtype(codes) if codes else dtype
        self.register_buffer("k", torch.zeros(shape, dtype=stored, device=device), persistent=False)
        # latent attention caches one tensor per token (its values are part of it): no v
        self.register_buffer("v", None if keys_only else torch.zeros(shape, dtype=stored, device=device),
                             persistent=False)
        if codes:
            self.register_buffer("k_scale", torch.ones(shape[:3], dtype=torch.float16, device=device), persistent=False)
            self.register_buffer("v_scale", torch.ones(shape[:3], dtype=torch.float16, device=device), persistent=False)
            self.register_buffer("lut", kv_format.table(codes, device), persistent=False)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor | Codes, Tensor | Codes]:
        """input_pos [S]; k, v [B, H_kv, S, d_h] -> all slots, k_all/v_all [B, H_kv, T_max, d_h]
        (as Codes for an 8-bit cache)."""
        if self.kind:
            return self._write_codes(input_pos, k, "k"), self._write_codes(input_pos, v, "v")
        self.k.index_copy_(2, input_pos, k.to(self.k.dtype))
        if self.v is None:
            return self.k, None
        self.v.index_copy_(2, input_pos, v.to(self.v.dtype))
        return self.k, self.v

    def keys_mask(self, mask: Tensor | None) -> Tensor | None:
        """The pass's mask over the keys `update` returned: the cache's slots are those keys."""
        return mask

    def _write_codes(self, input_pos: Tensor, x: Tensor, which: str) -> Codes:
        codes, scale = kv_format.quantize(x, self.kind)  # [B, H_kv, S, d_h], [B, H_kv, S]
        stored, scales = getattr(self, which), getattr(self, f"{which}_scale")
        stored.index_copy_(2, input_pos, codes)
        scales.index_copy_(2, input_pos, scale)
        return Codes(stored, scales, self.lut, self.reader)

    def reorder(self, rows: Tensor) -> None:
        """Keep batch rows `rows` [B] (beam search: each beam continues from its parent's cache)."""
        for buffer in (self.k, self.v) + ((self.k_scale, self.v_scale) if self.kind else ()):
            if buffer is not None:
                buffer.copy_(buffer.index_select(0, rows))

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for name, b in self.named_buffers() if name != "lut")


class KVCache(nn.ModuleList):
    """The caches of all L layers of a stack: model(..., cache=KVCache(...), input_pos=...);
    `codes` ("int8", "fp8_e4m3", "fp8_e5m2") stores 8-bit codes with scales instead of `dtype`, and
    `reader` is the attention that reads them as stored (None: they are turned into floats). A
    sliding-window layer keeps a ring of window + `slack` slots (window_cache.py) where that is shorter."""

    def __init__(self, config: ModelConfig, *, batch: int, max_len: int, n_layers: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 codes: str | None = None, reader=None, slack: int | None = None) -> None:
        from anatomy.inference.engine.window_cache import SLACK, WindowKVCache

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
        self.max_len = max_len
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
