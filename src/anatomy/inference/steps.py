"""The inputs of each step of a generation: the left-padded prompt batch, and the Context of
every decode step, built from tables made once per generation.

    prompts -> PaddedBatch: ids [B, P] (left padding), padding [B]
    decode step at cache slot s -> Context: rope (cos, sin) [B, 1, 1, d_h] looked up in a table of
        the T positions, mask [B, 1, 1, T] additive (0 where a key slot is real and <= s, -inf
        elsewhere; for sliding-window layers also -inf at slots <= s - window), input_pos [1] = s
    S tokens at slots s..s+S-1 in one pass (speculative verification) -> the same per query row:
        rope [B, S, 1, d_h], mask [B, 1, S, T] (row i causal up to slot s+i), input_pos [S]

A model's own forward builds the same Context from scratch and checks every input (a host sync);
a decode step only indexes the tables, so it costs a handful of small ops, none of them per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from anatomy.layers.context import Context
from anatomy.layers.position import alibi_bias
from anatomy.models.stack import Stack


@dataclass(frozen=True)
class PaddedBatch:
    """Prompts left-padded to one length: ids [B, P], padding [B] (pad slots at the start of each row)."""

    ids: Tensor
    padding: Tensor

    @classmethod
    def of(cls, prompts: list[list[int]], *, pad_id: int = 0, device: torch.device | str = "cpu") -> PaddedBatch:
        P = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, P - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        padding = torch.tensor([P - len(p) for p in prompts], dtype=torch.long)
        return cls(ids.to(device), padding.to(device))

    @property
    def padded(self) -> bool:
        return bool(self.padding.any())

    def slot_mask(self, max_len: int) -> Tensor | None:
        """attention_mask [B, T]: False on each row's padding slots; None when nothing is padded."""
        if not self.padded:
            return None
        return torch.arange(max_len, device=self.ids.device)[None] >= self.padding[:, None]

    def positions(self, slots: Tensor) -> Tensor | None:
        """position_ids [B, S] of the tokens at `slots` [S]; None when nothing is padded."""
        if not self.padded:
            return None
        return slots[None] - self.padding[:, None]


def rope_table(stack: Stack, n: int, *, dtype: torch.dtype,
               device: torch.device | str) -> tuple[Tensor, Tensor] | tuple[None, None]:
    """(cos, sin) [n, 1, d_h] of positions 0..n-1 for the stack's rotary embedding, indexed by position
    ids [B, S] to give a step's angles [B, S, 1, d_h]; (None, None) without RoPE."""
    rotary = stack.context.rotary
    if rotary is None:
        return None, None
    cos, sin = rotary(torch.arange(n, device=device)[None], dtype)  # 2 x [1, n, 1, d_h]
    return cos[0], sin[0]


class DecodeSteps:
    """The Context of each decode step of one generation over a cache of `max_len` slots."""

    def __init__(self, stack: Stack, batch: PaddedBatch, *, max_len: int, dtype: torch.dtype) -> None:
        device = batch.ids.device
        self.slots = torch.arange(max_len, device=device)  # [T]
        self.padding = batch.padding[:, None]  # [B, 1]
        self.valid = batch.slot_mask(max_len)  # [B, T] or None
        context = stack.context
        self.cos, self.sin = rope_table(stack, max_len, dtype=dtype, device=device)  # [T, 1, d_h] each, or None
        self.slopes = context.slopes
        self.window = context.window if context.window is not None and context.window < max_len else None
        rotary = context.rotary
        self.rotary = rotary if rotary is not None and rotary.length_dependent else None  # angles by pass length
        self.dtype = dtype
        self.open, self.closed = torch.zeros((), dtype=dtype, device=device), torch.tensor(float("-inf"), dtype=dtype,
                                                                                             device=device)

    def context(self, slot: Tensor) -> tuple[Context, Tensor]:
        """(the Context, position_ids [B, 1]) of the tokens written at cache slot `slot` [1]."""
        positions = slot[None] - self.padding  # [B, 1]
        rope = (self.cos[positions], self.sin[positions]) if self.cos is not None else None  # [B, 1, 1, d_h]
        if self.rotary is not None:
            rope = self.rotary(positions, self.dtype)
        allowed = self.slots <= slot  # [T]
        if self.valid is not None:
            allowed = allowed & self.valid  # [B, T]
        mask = self._additive(allowed)
        window_mask = self._additive(allowed & (self.slots > slot - self.window)) if self.window else None
        bias = alibi_bias(self.slopes, slot, self.slots, causal=True) if self.slopes is not None else None
        return Context(rope=rope, mask=mask, bias=bias, input_pos=slot, window_mask=window_mask), positions

    def span(self, slots: Tensor) -> tuple[Context, Tensor]:
        """(the Context, position_ids [B, S]) of S tokens written at cache slots `slots` [S] in one
        pass: each query row is what its own decode step would be (keys at slots <= its slot, its
        window, its RoPE angles; a length-dependent RoPE rule reads each token's own length)."""
        S = slots.numel()
        positions = slots[None] - self.padding  # [B, S]
        rope = (self.cos[positions], self.sin[positions]) if self.cos is not None else None  # [B, S, 1, d_h]
        if self.rotary is not None:
            columns = [self.rotary(positions[:, i:i + 1], self.dtype) for i in range(S)]  # S x 2 x [B, 1, 1, d_h]
            rope = (torch.cat([c for c, _ in columns], dim=1), torch.cat([s for _, s in columns], dim=1))
        allowed = self.slots[None] <= slots[:, None]  # [S, T]
        if self.valid is not None:
            allowed = allowed & self.valid[:, None]  # [B, S, T]
        mask = self._additive(allowed, S)
        window = allowed & (self.slots[None] > slots[:, None] - self.window) if self.window else None
        window_mask = self._additive(window, S) if window is not None else None
        bias = alibi_bias(self.slopes, slots, self.slots, causal=True) if self.slopes is not None else None
        return Context(rope=rope, mask=mask, bias=bias, input_pos=slots, window_mask=window_mask), positions

    def _additive(self, allowed: Tensor, rows: int = 1) -> Tensor:
        return torch.where(allowed, self.open, self.closed).view(-1, 1, rows, self.slots.numel())  # [B|1, 1, S, T]
