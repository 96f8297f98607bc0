"""The static KV cache: per layer, K and V preallocated as [B, H_kv, T_max, d_h] and written in
place at the slots `input_pos` names.

Nothing is ever appended or reallocated, so every decode step sees the same shapes (the step can
be compiled) and the memory is known up front: 2 * L * B * H_kv * T_max * d_h * bytes-per-value.
With GQA only the H_kv key/value heads are stored, never the H query heads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig


class LayerKVCache(nn.Module):
    """One layer's keys and values; `update` writes the new ones and returns all T_max slots."""

    def __init__(self, *, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.max_len = max_len
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """input_pos [S]; k, v [B, H_kv, S, d_h] -> all slots, k_all/v_all [B, H_kv, T_max, d_h]."""
        if k.dtype != self.k.dtype:
            k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        self.k.index_copy_(2, input_pos, k)
        self.v.index_copy_(2, input_pos, v)
        return self.k, self.v

    def reorder(self, rows: Tensor) -> None:
        """Keep batch rows `rows` [B] (beam search: each beam continues from its parent's cache)."""
        self.k.copy_(self.k.index_select(0, rows))
        self.v.copy_(self.v.index_select(0, rows))


class KVCache(nn.ModuleList):
    """The caches of all L layers of a stack: model(..., cache=KVCache(...), input_pos=...)."""

    def __init__(self, config: ModelConfig, *, batch: int, max_len: int, n_layers: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        n_layers = n_layers if n_layers is not None else config.cached_layers
        super().__init__(
            LayerKVCache(batch=batch, n_kv_heads=config.n_kv_heads, max_len=max_len, head_dim=config.head_dim,
                         dtype=dtype, device=device)
            for _ in range(n_layers))
        self.max_len = max_len
        self.owner = None  # a weak reference to the run the engine lent this cache to

    def reorder(self, rows: Tensor) -> None:
        for layer in self:
            layer.reorder(rows)

    @property
    def nbytes(self) -> int:
        return sum(layer.k.nbytes + layer.v.nbytes for layer in self)


def bytes_per_token(config: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """Cache bytes one token costs: config.kv_values_per_token * bytes per value."""
    return config.kv_values_per_token * dtype.itemsize
