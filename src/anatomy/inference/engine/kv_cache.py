"""The static KV cache of a model called directly: model(ids, cache=KVCache(...), input_pos=...).

It is the paged cache (paged.py) with one fixed block table per batch row: row b's blocks are
b * nb .. b * nb + nb - 1 in position order, so cache slot p of row b is pool slot b * T_max + p, and
each layer is a PagedLayer whose slots are made from the pass's `input_pos` (`StaticLayer`). Nothing is
appended or reallocated: every decode step sees the same shapes and the memory is known up front,
the rows' 2 * L * B * H_kv * T_max * d_h values (8-bit codes and scales with `codes`) and one scratch block.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.deprecation import deprecated
from anatomy.inference.engine.paged import BlockSlots, PagedKVCache, PagedLayer, PagedPool, bytes_per_token, \
    register_kv
from anatomy.kv_format import Codes, Pages

__all__ = ["KVCache", "StaticLayer", "block_size", "bytes_per_token"]

MAX_BLOCK = 16  # tokens per block at most (a run's RUN_BLOCK)


class KVCache(nn.Module):
    """The caches of all L layers of a stack (a sequence of StaticLayer over `paged`, a PagedKVCache):
    writes at the `input_pos` slots, the same for every row, and returns each row's keys and values over
    all T_max slots. `codes` ("int8", "fp8_e4m3", "fp8_e5m2") stores 8-bit codes with scales instead of
    `dtype`, and `reader` is the attention that reads them as stored (None: they are turned into floats).
    A sliding-window layer keeps all T_max slots too (its mask applies the window): the rings of window +
    slack slots are the engine's runs' (run.py); `slack` is accepted and not used."""

    def __init__(self, config: ModelConfig, *, batch: int, max_len: int, n_layers: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 codes: str | None = None, reader=None, slack: int | None = None) -> None:
        super().__init__()
        bs = block_size(max_len)
        self.paged = PagedKVCache(config, num_blocks=batch * max_len // bs, block_size=bs, dtype=dtype, device=device,
                                  codes=codes, reader=reader, n_layers=n_layers)
        self.layers = [StaticLayer(pool, batch, max_len) for pool in self.paged]
        self.max_len, self.dtype, self.kind = max_len, dtype, codes

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> StaticLayer:
        return self.layers[i]

    def __iter__(self):
        return iter(self.layers)

    def reorder(self, rows: Tensor) -> None:
        """Keep batch rows `rows` [B] (beam search): each row's blocks become a copy of its parent's."""
        blocks = self.max_len // self.paged.block_size
        parents = (rows[:, None] * blocks + torch.arange(blocks, device=rows.device)).reshape(-1)
        for name, buffer in self.paged.named_buffers():
            if not name.endswith("lut"):
                buffer[:len(parents)] = buffer.index_select(0, parents)

    @property
    def rewind_limit(self) -> int:
        """The most slots a run may take back: all of them (no layer keeps a ring)."""
        return self.max_len

    @property
    def nbytes(self) -> int:
        """The pools' bytes: the rows' slots and the scratch block."""
        return self.paged.nbytes


class StaticLayer(PagedLayer):
    """One layer of a KVCache: a PagedLayer over `rows` fixed block tables of `max_len` slots each, where
    a pass's tokens go made from its input_pos [S] (every row writes the same slots)."""

    def __init__(self, pool: PagedPool, rows: int, max_len: int) -> None:
        blocks = max_len // pool.k.shape[1]
        none = torch.zeros(0, dtype=torch.long, device=pool.k.device)
        super().__init__(pool, BlockSlots(none, none, rows, 0, blocks))

    def at(self, input_pos: Tensor) -> BlockSlots:
        """Where the tokens at cache slots input_pos [S] go in every row, and each row's table."""
        rows, blocks = self.where.rows, self.where.blocks
        first = torch.arange(rows, device=input_pos.device)[:, None] * self.max_len  # [B, 1]
        tables = torch.arange(rows * blocks, device=input_pos.device)
        return BlockSlots((first + input_pos).reshape(-1), tables, rows, len(input_pos), blocks)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Pages | Codes, Pages | Codes]:
        """input_pos [S]; k, v [B, H_kv, S, d_h] -> every row's keys and values over its T_max slots."""
        self.where = self.at(input_pos)
        return super().update(input_pos, k, v)


def block_size(max_len: int) -> int:
    """The largest divisor of max_len up to MAX_BLOCK: the rows' T = nb * bs is then exactly max_len, the
    keys the pass's mask over cache slots covers, and the scratch block stays small."""
    return max(d for d in range(1, MAX_BLOCK + 1) if max_len % d == 0)


def _one_layer(*, batch: int, n_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype = torch.float32,
               device=None, codes: str | None = None, reader=None, keys_only: bool = False, **window) -> StaticLayer:
    """What LayerKVCache(...) and WindowKVCache(...) made: one layer's static cache (a window keeps all slots)."""
    bs = block_size(max_len)
    pool = PagedPool((batch * max_len // bs + 1, bs, n_kv_heads, head_dim), dtype=dtype, device=device, codes=codes,
                     reader=reader, keys_only=keys_only)
    return StaticLayer(pool, batch, max_len)


_LAYER = "a KVCache's layers are paged (StaticLayer); build the whole cache with KVCache(config, ...)"
_OLD = {"LayerKVCache": (_one_layer, _LAYER), "WindowKVCache": (_one_layer, _LAYER),
        "register_kv": (register_kv, "it moved to anatomy.inference.engine.paged")}


def __getattr__(name: str):
    """The old names of layer_cache.py and window_cache.py (kept for a release, with a warning)."""
    if name in _OLD:
        found, instead = _OLD[name]
        deprecated(f"{name} is deprecated: {instead}")
        return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
