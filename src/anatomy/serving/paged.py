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
keys and values once per layer per step (measured in docs/serving.md); a kernel reading the pool
through the table in place would avoid that copy.

The pools start zeroed and every slot ever gathered is finite (scratch included), so masked keys
can never turn an attention row into NaN (0 * NaN is NaN, 0 * a finite value is 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from anatomy.config import ModelConfig
from anatomy.inference.kv_cache import bytes_per_token
from anatomy.inference.steps import rope_table
from anatomy.layers.context import Context
from anatomy.models.stack import Stack


class PagedKVCache:
    """The block pools of every layer: K and V [num_blocks + 1, block_size, H_kv, d_h] each."""

    def __init__(self, config: ModelConfig, *, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch = num_blocks  # the extra block padding writes to and missing blocks read from
        shape = (num_blocks + 1, block_size, config.n_kv_heads, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.cached_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.cached_layers)]

    @staticmethod
    def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one block costs over all layers, K and V."""
        return bytes_per_token(config, dtype) * block_size

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.k + self.v)

    def step(self, plan: StepPlan) -> list[PagedLayer]:
        """Each layer's LayerCache for one step laid out by `plan`."""
        return [PagedLayer(k, v, plan) for k, v in zip(self.k, self.v)]


@dataclass(frozen=True)
class StepPlan:
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

    def __init__(self, k_pool: Tensor, v_pool: Tensor, plan: StepPlan) -> None:
        self.k_pool, self.v_pool, self.plan = k_pool, v_pool, plan
        self.max_len = plan.blocks * k_pool.shape[1]

    def update(self, input_pos: Tensor | None, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v [B, H_kv, S, d_h] written through the plan -> every row's keys/values [B, H_kv, T, d_h].
        (input_pos is not used: the plan holds each row's own slots.)"""
        return self._update(self.k_pool, k), self._update(self.v_pool, v)

    def _update(self, pool: Tensor, new: Tensor) -> Tensor:
        plan = self.plan
        _, bs, H_kv, d_h = pool.shape
        flat = pool.view(-1, H_kv, d_h)  # [(N+1) * bs, H_kv, d_h]
        flat.index_copy_(0, plan.slots, new.transpose(1, 2).reshape(-1, H_kv, d_h).to(pool.dtype))
        rows = pool.index_select(0, plan.tables)  # [B * nb, bs, H_kv, d_h]
        return rows.view(plan.rows, plan.blocks * bs, H_kv, d_h).transpose(1, 2)  # [B, H_kv, T, d_h]


@dataclass(frozen=True)
class Chunk:
    """One row of a step: `tokens` to run at positions start, start+1, ... of a sequence whose
    block table (covering them) is `blocks`."""

    tokens: list[int]
    start: int
    blocks: list[int]


@dataclass(frozen=True)
class StepInputs:
    """Everything one forward over a batch of chunks needs: ids and positions [B, S], the Context,
    the per-layer caches, and each row's last real index [B] (whose logits are wanted)."""

    ids: Tensor
    positions: Tensor
    ctx: Context
    caches: list[PagedLayer]
    last: Tensor


class StepBuilder:
    """Builds a step's inputs from its chunks, with the RoPE angles looked up in a table made once."""

    def __init__(self, stack: Stack, cache: PagedKVCache, *, context: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.cache, self.dtype, self.device = cache, dtype, torch.device(device)
        self.cos, self.sin = rope_table(stack, context, dtype=dtype, device=device)  # [T_ctx, 1, d_h] or None
        rotary = stack.context.rotary
        self.rotary = rotary if rotary is not None and rotary.length_dependent else None  # angles by reach
        self.slopes = stack.context.slopes
        self.window = stack.context.window  # the sliding-window layers' window, or None

    def build(self, chunks: list[Chunk]) -> StepInputs:
        bs, scratch = self.cache.block_size, self.cache.scratch
        B, S = len(chunks), max(len(c.tokens) for c in chunks)
        nb = max(-(-(c.start + len(c.tokens)) // bs) for c in chunks)
        ids, positions, slots, tables = [], [], [], []
        for c in chunks:
            n, pad = len(c.tokens), S - len(c.tokens)
            pos = list(range(c.start, c.start + n))
            ids.append(c.tokens + [0] * pad)
            positions.append(pos + [0] * pad)
            slots += [c.blocks[p // bs] * bs + p % bs for p in pos] + [scratch * bs + i % bs for i in range(pad)]
            tables += c.blocks[:nb] + [scratch] * (nb - min(nb, len(c.blocks)))
        as_long = dict(dtype=torch.long, device=self.device)
        ids, positions = torch.tensor(ids, **as_long), torch.tensor(positions, **as_long)  # [B, S]
        plan = StepPlan(torch.tensor(slots, **as_long), torch.tensor(tables, **as_long), B, S, nb)
        last = torch.tensor([len(c.tokens) - 1 for c in chunks], **as_long)
        return StepInputs(ids, positions, self._context(positions, nb * bs), self.cache.step(plan), last)

    def _context(self, positions: Tensor, T: int) -> Context:
        """RoPE angles [B, S, 1, d_h], the additive masks [B, 1, S, T] (each query sees the keys at
        positions <= its own, and a sliding-window layer only the last `window` of them; a padding
        query, at position 0, sees key 0) and ALiBi's bias [B, H, S, T]."""
        keys = torch.arange(T, device=self.device)  # [T]
        seen = keys[None, None, :] <= positions[:, :, None]  # [B, S, T]
        window_mask = None
        if self.window is not None and T > self.window:
            window_mask = self._additive(seen & (keys[None, None, :] > positions[:, :, None] - self.window))
        bias = None
        if self.slopes is not None:
            distance = (positions[:, None, :, None] - keys).to(self.dtype)  # [B, 1, S, T]
            bias = -self.slopes.to(self.device, self.dtype)[None, :, None, None] * distance  # [B, H, S, T]
        return Context(rope=self._rope(positions), mask=self._additive(seen), bias=bias, window_mask=window_mask)

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor] | None:
        """(cos, sin) [B, S, 1, d_h]: looked up in the table, or, when the frequencies depend on how far
        a pass reaches (dynamic NTK, LongRoPE), computed for each row from its own reach."""
        if self.rotary is not None:
            rows = [self.rotary(positions[b:b + 1], self.dtype) for b in range(positions.shape[0])]
            return torch.cat([cos for cos, _ in rows]), torch.cat([sin for _, sin in rows])
        if self.cos is None:
            return None
        return self.cos[positions], self.sin[positions]

    def _additive(self, allowed: Tensor) -> Tensor:
        """bool [B, S, T] -> [B, 1, S, T]: 0 where allowed, -inf elsewhere."""
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~allowed, float("-inf"))[:, None]
