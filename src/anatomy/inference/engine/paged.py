"""The paged KV cache: one pool of fixed-size blocks per layer, read through per-sequence block tables.

    pool (per layer, K and V)   [N + 1, bs, H_kv, d_h]    N blocks of bs token slots; block N is scratch
    block table of a sequence   [b0, b1, b2, ...]        token at position p lives in block table[p // bs],
                                                          slot p % bs
    a step over B rows, S new tokens each (right-padded), T = nb * bs key slots:
      write    k, v [B, H_kv, S, d_h] -> pool slots table[p // bs] * bs + p % bs   (padding -> scratch)
      gather   pool[tables [B, nb]] -> k_all, v_all [B, H_kv, T, d_h]            (missing blocks -> scratch)
      mask     [B, 1, S, T]: 0 where key position <= the query's position, -inf elsewhere

The gathered keys sit at their own positions (slot j of the gather is position j), so the model's
attention runs unchanged on a `PagedLayer`, the `LayerCache` of one layer for one step: `update`
writes the new keys and values and returns the rows' gathered ones. The gather copies every row's
keys and values once per layer per step; a kernel reading the pool through the table in place
would avoid that copy.

The pools start zeroed and every slot ever gathered is finite (scratch included), so masked keys
can never turn an attention row into NaN (0 * NaN is NaN, 0 * a finite value is 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.inference.engine.kv_cache import bytes_per_token
from anatomy.layers.context import Context
from anatomy.models.context import ContextTables
from anatomy.models.stack import Stack


class PagedPool(nn.Module):
    """One layer's K and V block pools [num_blocks + 1, block_size, H_kv, d_h]."""

    def __init__(self, shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)


class PagedKVCache(nn.ModuleList):
    """The block pools of every layer (an nn.ModuleList of PagedPool, so a captured step holds them)."""

    def __init__(self, config: ModelConfig, *, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        shape = (num_blocks + 1, block_size, config.n_kv_heads, config.head_dim)
        super().__init__(PagedPool(shape, dtype=dtype, device=device) for _ in range(config.cached_layers))
        self.num_blocks, self.block_size, self.dtype = num_blocks, block_size, dtype
        self.scratch = num_blocks  # the extra block padding writes to and missing blocks read from
        self.tables: ContextTables | None = None  # the RoPE table of a stack, made on first use

    @staticmethod
    def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one block costs over all layers, K and V."""
        return bytes_per_token(config, dtype) * block_size

    @property
    def nbytes(self) -> int:
        return sum(pool.k.nbytes + pool.v.nbytes for pool in self)

    def layers(self, where: BlockSlots) -> list[PagedLayer]:
        """Each layer's LayerCache for one step laid out by `where`."""
        return [PagedLayer(pool.k, pool.v, where) for pool in self]

    def context_tables(self, stack: Stack, length: int) -> ContextTables:
        """The position tables of `stack` over `length` positions (made once, grown when a longer step comes)."""
        if self.tables is None or len(self.tables.slots) < length:
            self.tables = ContextTables(stack.context, length=max(length, 2 * self.block_size), dtype=self.dtype,
                                        device=self[0].k.device)
        return self.tables


@dataclass(frozen=True)
class BlockSlots:
    """Where a step's tokens go and which blocks each row reads.

    slots [B * S] flat pool slots of the new tokens (row-major; padding -> scratch slots),
    tables [B * nb] the block ids each row reads (padding -> the scratch block); B, S, nb.
    """

    slots: Tensor
    tables: Tensor
    rows: int
    new: int
    blocks: int


class PagedLayer:
    """One layer's paged cache for one step (the `LayerCache` protocol of layers/attention.py)."""

    def __init__(self, k_pool: Tensor, v_pool: Tensor, where: BlockSlots) -> None:
        self.k_pool, self.v_pool, self.where = k_pool, v_pool, where
        self.max_len = where.blocks * k_pool.shape[1]

    def update(self, input_pos: Tensor | None, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v [B, H_kv, S, d_h] -> every row's keys and values [B, H_kv, nb * bs, d_h] (input_pos is
        not used: `where` holds each row's own slots)."""
        return self._update(self.k_pool, k), self._update(self.v_pool, v)

    def _update(self, pool: Tensor, new: Tensor) -> Tensor:
        where = self.where
        _, bs, H_kv, d_h = pool.shape
        flat = pool.view(-1, H_kv, d_h)  # [(N+1) * bs, H_kv, d_h]
        flat.index_copy_(0, where.slots, new.transpose(1, 2).reshape(-1, H_kv, d_h).to(pool.dtype))
        rows = pool.index_select(0, where.tables)  # [B * nb, bs, H_kv, d_h]
        return rows.view(where.rows, where.blocks * bs, H_kv, d_h).transpose(1, 2)  # [B, H_kv, T, d_h]


@dataclass(frozen=True)
class Chunk:
    """One row of a step: `tokens` to run at positions start, start+1, ... of a sequence whose block
    table (covering them) is `blocks`; the logits of its last `logits` tokens are wanted (0: none,
    1: the next token's, more: speculative verification or prompt log-probabilities)."""

    tokens: list[int]
    start: int
    blocks: list[int]
    logits: int = 1


@dataclass(frozen=True)
class PagedInputs:
    """Everything one forward over a batch of chunks needs: ids and positions [B, S], the Context,
    where the tokens go, and the (rows, columns) of the positions whose logits are wanted."""

    ids: Tensor
    positions: Tensor
    ctx: Context
    where: BlockSlots
    wanted: tuple[Tensor, Tensor]


def paged_inputs(stack: Stack, cache: PagedKVCache, chunks: list[Chunk], *, rows: int | None = None,
                 blocks_multiple: int | None = None) -> PagedInputs:
    """The inputs of one step over `chunks`; `rows` pads the batch with rows that write to and read
    from the scratch block, `blocks_multiple` rounds the blocks each row reads up (a captured step's
    shape)."""
    bs, scratch = cache.block_size, cache.scratch
    B, S = max(rows or 0, len(chunks)), max(len(c.tokens) for c in chunks)
    nb = max(-(-(c.start + len(c.tokens)) // bs) for c in chunks)
    if blocks_multiple:
        nb = -(-nb // blocks_multiple) * blocks_multiple
    ids, positions, slots, tables, want_rows, want_cols = [], [], [], [], [], []
    for i, c in enumerate(chunks):
        n, pad = len(c.tokens), S - len(c.tokens)
        pos = list(range(c.start, c.start + n))
        ids.append(c.tokens + [0] * pad)
        positions.append(pos + [0] * pad)
        slots += [c.blocks[p // bs] * bs + p % bs for p in pos] + [scratch * bs + j % bs for j in range(pad)]
        tables += c.blocks[:nb] + [scratch] * (nb - min(nb, len(c.blocks)))
        want_rows += [i] * c.logits
        want_cols += range(n - c.logits, n)
    for _ in range(B - len(chunks)):  # padding rows: position 0 in the scratch block
        ids.append([0] * S)
        positions.append([0] * S)
        slots += [scratch * bs + j % bs for j in range(S)]
        tables += [scratch] * nb
    as_long = dict(dtype=torch.long, device=cache[0].k.device)
    ids, positions = torch.tensor(ids, **as_long), torch.tensor(positions, **as_long)  # [B, S]
    where = BlockSlots(torch.tensor(slots, **as_long), torch.tensor(tables, **as_long), B, S, nb)
    ctx = cache.context_tables(stack, nb * bs).build(positions, q_slots=positions, keys=nb * bs)
    wanted = (torch.tensor(want_rows, **as_long), torch.tensor(want_cols, **as_long))
    return PagedInputs(ids, positions, ctx, where, wanted)
