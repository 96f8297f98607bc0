"""One layer's static KV cache: K and V preallocated as [B, H_kv, T_max, d_h], written in place at the
slots `input_pos` names (8-bit codes and scales with a kv_dtype; keys only for latent attention). The
whole stack's cache is kv_cache.KVCache; a sliding-window layer's ring is window_cache.WindowKVCache."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy import kv_format
from anatomy.kv_format import Codes


class LayerKVCache(nn.Module):
    """One layer's keys and values; `update` writes the new ones and returns all T_max slots."""

    def __init__(self, *, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 codes: str | None = None, reader=None, keys_only: bool = False) -> None:
        super().__init__()
        self.max_len, self.kind, self.reader = max_len, codes, reader
        register_kv(self, (batch, n_kv_heads, max_len, head_dim), dtype=dtype, device=device, codes=codes,
                    keys_only=keys_only)

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


def register_kv(module: nn.Module, shape: tuple[int, ...], *, dtype: torch.dtype, device, codes: str | None,
                keys_only: bool) -> None:
    """A cache's buffers of `shape` on `module`: k and v (floats of dtype, or 8-bit codes with float16
    scales over shape[:3] and the codes' table), no v for latent attention (its values are part of k)."""
    stored = kv_format.code_dtype(codes) if codes else dtype
    module.register_buffer("k", torch.zeros(shape, dtype=stored, device=device), persistent=False)
    module.register_buffer("v", None if keys_only else torch.zeros(shape, dtype=stored, device=device),
                           persistent=False)
    if codes:
        module.register_buffer("k_scale", torch.ones(shape[:3], dtype=torch.float16, device=device), persistent=False)
        module.register_buffer("v_scale", torch.ones(shape[:3], dtype=torch.float16, device=device), persistent=False)
        module.register_buffer("lut", kv_format.table(codes, device), persistent=False)
