"""The paged KV cache: one pool of fixed-size blocks per layer, read through per-sequence block tables.

Token position p of a sequence lives in block table[p // bs], slot p % bs; block N of each pool is
scratch (padding writes there, missing blocks read it). A `PagedLayer` is one layer's LayerCache for
one step: `update` writes the new keys and values and returns the pool with the rows' tables
(`Pages`), which a native reader reads in place and anything else gathers. The pools start zeroed (masked
keys stay finite). Sliding-window layers can have a smaller block group (`window_blocks`); an 8-bit cache
stores codes and a scale per token and head. kv_cache.KVCache is this cache with a fixed table per row.
Shapes, masks and a worked step: docs/serving.md, "The paged KV cache".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from anatomy import dtypes, kv_format
from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.kv_format import Codes, Pages
from anatomy.layers.pass_inputs import PassInputs
from anatomy.models.position_rules import PositionTables
from anatomy.models.stack import Stack


class PagedPool(nn.Module):
    """One layer's K and V block pools [num_blocks + 1, block_size, H_kv, d_h] (8-bit codes with their
    scales [num_blocks + 1, block_size, H_kv] when `codes` names a kind); `reader` is attention that
    reads them as stored (a float pool's blocks in place, an 8-bit pool's codes), or None."""

    def __init__(self, shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device | str,
                 codes: str | None = None, reader=None, keys_only: bool = False) -> None:
        super().__init__()
        self.kind, self.reader = codes, reader
        register_kv(self, shape, dtype=dtype, device=device, codes=codes, keys_only=keys_only)


class PagedKVCache(nn.ModuleList):
    """The block pools of every layer (an nn.ModuleList of PagedPool, so a captured step holds them), in
    `dtype`; `compute_dtype` (default: dtype) is the dtype attention computes in, that of the steps'
    masks and RoPE angles (a bf16 cache of an f32 model: f32); `n_layers` (default: the config's cached
    layers) pools, where there is no sliding-window group."""

    def __init__(self, config: ModelConfig, *, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str | None = "cpu", codes: str | None = None, reader=None,
                 window_blocks: int | None = None, compute_dtype: torch.dtype | None = None,
                 n_layers: int | None = None) -> None:
        token = (config.n_kv_heads, config.head_dim)
        if config.latent:  # one "head" per token: the latent and the RoPE key
            if codes:
                raise InputError(f"kv_dtype={codes!r}: a latent-attention cache (kv_lora_rank="
                                 f"{config.kv_lora_rank}) holds floats only")
            token = (1, config.kv_values_per_layer)
        layers = config.cached_layers if n_layers is None else n_layers
        self.windowed = windowed_layers(config) if window_blocks is not None else (False,) * layers
        super().__init__(PagedPool(((window_blocks if w else num_blocks) + 1, block_size, *token), dtype=dtype,
                                   device=device, codes=codes, reader=reader, keys_only=config.latent)
                         for w in self.windowed)
        self.num_blocks, self.block_size, self.dtype, self.kind = num_blocks, block_size, dtype, codes
        self.window_blocks = window_blocks
        self.scratch = num_blocks  # the extra block padding writes to and missing blocks read from
        self.window_scratch = window_blocks  # the same in the sliding-window layers' group
        self.compute_dtype = compute_dtype or dtype  # what attention computes in: its masks' and angles' dtype
        self.tables: PositionTables | None = None  # the RoPE table of a stack, made on first use

    @staticmethod
    def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype | str, *,
                    windowed: bool | None = None) -> int:
        """Bytes one block costs over all layers, K and V (scales included): dtype a float torch dtype
        or a KV dtype name; `windowed` True or False: over the sliding-window layers' group or the others only."""
        layers = config.cached_layers
        if windowed is not None:
            layers = sum(w == windowed for w in windowed_layers(config))
        return bytes_per_token(config, dtype) * block_size * layers // config.cached_layers

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for name, b in self.named_buffers() if not name.endswith("lut"))

    @property
    def exact(self) -> bool:
        """Whether the blocks hold keys and values as attention computed them (floats in its dtype)."""
        return self.kind is None and self.dtype == self.compute_dtype

    def layers(self, where: BlockSlots) -> list[PagedLayer]:
        """Each layer's LayerCache for one step laid out by `where` (a sliding-window layer's by `where.window`)."""
        return [PagedLayer(pool, where.window if w else where) for pool, w in zip(self, self.windowed)]

    def position_tables(self, stack: Stack, length: int) -> PositionTables:
        """The position tables of `stack` over `length` positions (made once, grown when a longer step comes)."""
        if self.tables is None or len(self.tables.slots) < length:
            self.tables = PositionTables(stack.position_rules, length=max(length, 2 * self.block_size),
                                         dtype=self.compute_dtype,
                                         device=self[0].k.device)
        return self.tables


@dataclass(frozen=True)
class BlockSlots:
    """Where a step's tokens go and which blocks each row reads.

    slots [B * S] flat pool slots of the new tokens (row-major; padding -> scratch slots),
    tables [B * nb] the block ids each row reads (padding -> the scratch block); B, S, nb;
    window_slots, window_tables: the same in the sliding-window layers' group (None: no such group).
    """

    slots: Tensor
    tables: Tensor
    rows: int
    new: int
    blocks: int
    window_slots: Tensor | None = None
    window_tables: Tensor | None = None

    @property
    def window(self) -> BlockSlots:
        """Where the sliding-window layers' group writes and reads."""
        return BlockSlots(self.window_slots, self.window_tables, self.rows, self.new, self.blocks)

    def tensors(self) -> tuple[Tensor, ...]:
        """slots, tables (and the window group's): what a captured step takes."""
        extra = () if self.window_slots is None else (self.window_slots, self.window_tables)
        return (self.slots, self.tables) + extra

    @staticmethod
    def of(tensors: tuple[Tensor, ...], rows: int, new: int, blocks: int) -> BlockSlots:
        """The BlockSlots whose `tensors()` these are."""
        return BlockSlots(*tensors[:2], rows, new, blocks, *tensors[2:])


class PagedLayer:
    """One layer's paged cache for one step (the `LayerCache` protocol of layers/attention.py)."""

    def __init__(self, pool: PagedPool, where: BlockSlots) -> None:
        self.pool, self.where = pool, where
        self.max_len = where.blocks * pool.k.shape[1]

    def at(self, input_pos: Tensor | None) -> BlockSlots:
        """Where this step writes and reads (the step's own layout: input_pos is not used)."""
        return self.where

    def update(self, input_pos: Tensor | None, k: Tensor, v: Tensor) -> tuple[Pages | Codes, Pages | Codes]:
        """k, v [B, H_kv, S, d_h] -> every row's keys and values over T = nb * bs slots: a float pool's
        Pages (read in place, or gathered into [B, H_kv, T, d_h] by attention), an 8-bit pool's codes and
        scales gathered as Codes (input_pos is not used: `where` holds each row's own slots)."""
        pool = self.pool
        if pool.v is None:  # latent attention: keys only
            return self._write(pool.k, k), None
        if pool.kind is None:
            return self._write(pool.k, k), self._write(pool.v, v)
        return self._codes(pool.k, pool.k_scale, k), self._codes(pool.v, pool.v_scale, v)

    def keys_mask(self, mask: Tensor | None) -> Tensor | None:
        """The step's mask over each row's slots: the pages are those slots."""
        return mask

    def _codes(self, codes: Tensor, scales: Tensor, new: Tensor) -> Codes:
        q, s = kv_format.quantize(new, self.pool.kind)  # [B, H_kv, S, d_h], [B, H_kv, S]
        return Codes(self._write(codes, q).gather(), self._write(scales, s).gather(), self.pool.lut, self.pool.reader)

    def _write(self, pool: Tensor, new: Tensor) -> Pages:
        """Write new [B, H_kv, S, ...] at the step's slots; the pool with every row's block table."""
        where = self.where
        rest = pool.shape[2:]  # (H_kv, d_h), or (H_kv,) for scales
        flat = pool.view(-1, *rest)  # [(N+1) * bs, H_kv, ...]
        flat.index_copy_(0, where.slots, new.transpose(1, 2).reshape(-1, *rest).to(pool.dtype))
        return Pages(pool, where.tables.view(where.rows, where.blocks), self.pool.reader)


@dataclass(frozen=True)
class Chunk:
    """One row of a step: `tokens` to run at positions start, start+1, ... of a sequence whose block
    table (covering them) is `blocks`; the logits of its last `logits` tokens are wanted (0: none,
    1: the next token's, more: speculative verification or prompt log-probabilities). With a windowed
    cache, `window_blocks` is its table in the sliding-window layers' group (-1: a block given back).
    `adapter`: the slot of the LoRA adapter the row runs with (0: none; the engine's AdapterSlots), its
    update scaled by `adapter_scale`."""

    tokens: list[int]
    start: int
    blocks: list[int]
    logits: int = 1
    window_blocks: list[int] | None = None
    adapter: int = 0
    adapter_scale: float = 1.0


@dataclass(frozen=True)
class PagedInputs:
    """Everything one forward over a batch of chunks needs: ids and positions [B, S], the PassInputs,
    where the tokens go, and the (rows, columns) of the positions whose logits are wanted."""

    ids: Tensor
    positions: Tensor
    ctx: PassInputs
    where: BlockSlots
    wanted: tuple[Tensor, Tensor]


def paged_inputs(stack: Stack, cache: PagedKVCache, chunks: list[Chunk], *, rows: int | None = None,
                 blocks_multiple: int | None = None, blocks: int | None = None) -> PagedInputs:
    """The inputs of one step over `chunks`; `rows` pads the batch with rows that write to and read
    from the scratch block, `blocks` is the least number of blocks each row reads and `blocks_multiple`
    rounds that up (a captured step's shape)."""
    bs = cache.block_size
    B, S = max(rows or 0, len(chunks)), max(len(c.tokens) for c in chunks)
    nb = max(blocks or 0, *(-(-(c.start + len(c.tokens)) // bs) for c in chunks))
    if blocks_multiple:
        nb = -(-nb // blocks_multiple) * blocks_multiple
    windowed = cache.window_blocks is not None
    if windowed and any(c.window_blocks is None for c in chunks):
        raise InputError("a cache with a sliding-window group of blocks needs each chunk's window_blocks")
    ids, positions, want_rows, want_cols = [], [], [], []
    for i, c in enumerate(chunks):
        n, pad = len(c.tokens), S - len(c.tokens)
        ids.append(c.tokens + [0] * pad)
        positions.append(list(range(c.start, c.start + n)) + [0] * pad)
        want_rows += [i] * c.logits
        want_cols += range(n - c.logits, n)
    for _ in range(B - len(chunks)):  # padding rows: position 0 in the scratch block
        ids.append([0] * S)
        positions.append([0] * S)
    as_long = dict(dtype=torch.long, device=cache[0].k.device)
    groups = [_layout([c.blocks for c in chunks], chunks, cache.scratch, B, S, nb, bs, as_long)]
    if windowed:
        groups.append(_layout([c.window_blocks for c in chunks], chunks, cache.window_scratch, B, S, nb, bs, as_long))
    ids, positions = torch.tensor(ids, **as_long), torch.tensor(positions, **as_long)  # [B, S]
    where = BlockSlots.of(tuple(t for group in groups for t in group), B, S, nb)
    fresh = rows is None and S > 1 and cache.exact and all(c.start == 0 and len(c.tokens) == S for c in chunks)
    ctx = cache.position_tables(stack, nb * bs).build(positions, q_slots=positions, keys=S if fresh else nb * bs,
                                                      new_keys_only=fresh)  # fresh prompts: PassInputs.new_keys_only
    wanted = (torch.tensor(want_rows, **as_long), torch.tensor(want_cols, **as_long))
    return PagedInputs(ids, positions, ctx, where, wanted)


def _layout(tables: list[list[int]], chunks: list[Chunk], scratch: int, B: int, S: int, nb: int, bs: int,
            as_long: dict) -> tuple[Tensor, Tensor]:
    """One group's slots [B * S] and tables [B * nb] for the chunks' block tables (-1 and padding -> scratch)."""
    slots, flat = [], []
    for c, table in zip(chunks, tables):
        pad = S - len(c.tokens)
        slots += [(scratch if table[p // bs] < 0 else table[p // bs]) * bs + p % bs
                  for p in range(c.start, c.start + len(c.tokens))]
        slots += [scratch * bs + j % bs for j in range(pad)]
        row = [scratch if b < 0 else b for b in table[:nb]]
        flat += row + [scratch] * (nb - len(row))
    for _ in range(B - len(chunks)):
        slots += [scratch * bs + j % bs for j in range(S)]
        flat += [scratch] * nb
    return torch.tensor(slots, **as_long), torch.tensor(flat, **as_long)


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


def bytes_per_token(config: ModelConfig, dtype: torch.dtype | str = torch.float32) -> int:
    """Cache bytes one token costs (a KV dtype name or a float torch dtype), scales included."""
    return kv_format.kv_bytes_per_token(config, dtypes.name_of(dtype) if isinstance(dtype, torch.dtype) else dtype)


def windowed_layers(config: ModelConfig) -> tuple[bool, ...]:
    """Which cached layers attend through a sliding window (their blocks can go once out of it)."""
    return tuple(config.layer_window(i) is not None for i in range(config.cached_layers))
