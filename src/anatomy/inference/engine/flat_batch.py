"""One forward over chunks of every length: a flat token batch [1, T] over a paged cache.

Chunks of one length form a group of rows (decode rows, verification rows of k + 1 tokens, prefill
chunks); the groups lie end to end on one token axis, so every projection, norm and FFN runs once over
all T tokens, nothing padded. Each layer's cache is a `FlatLayer`: it writes each group's keys and
values through the group's block tables and gives attention the groups apart (layers/segments.py),
each with its own mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from anatomy.inference.engine.paged import Chunk, PagedInputs, PagedKVCache, PagedLayer, paged_inputs
from anatomy.layers.pass_inputs import PassInputs
from anatomy.layers.segments import Segment, Segments, rows_of
from anatomy.models.stack import Stack


class FlatLayer:
    """One layer's cache for a flat batch (the `LayerCache` protocol): its groups' PagedLayers, each
    with where its tokens lie on the axis (start, rows, new), its mask, its bias and whether the group
    is fresh prompts that attend over their new keys alone (PassInputs.new_keys_only)."""

    def __init__(self, parts: list[tuple[int, int, int, PagedLayer, Tensor | None, Tensor | None, bool]]) -> None:
        self.parts = parts
        self.max_len = max(part[3].max_len for part in parts)

    def update(self, input_pos: Tensor | None, k: Tensor, v: Tensor | None) -> tuple[Segments, None]:
        """k, v [1, H_kv, T, d_h] written group by group -> the groups' keys and values as Segments."""
        parts = []
        for start, rows, new, layer, mask, bias, fresh in self.parts:
            k_g, v_g = rows_of(k, start, rows, new), rows_of(v, start, rows, new) if v is not None else None
            kk, vv = layer.update(None, k_g, v_g)
            if fresh:  # written; attention reads the new keys and values as computed
                kk, vv = k_g, v_g
            parts.append(Segment(start, rows, new, kk, vv, mask, bias, causal=fresh and mask is None))
        return Segments(tuple(parts)), None

    def keys_mask(self, mask: Tensor | None) -> Tensor | None:
        return mask  # None: each group carries its own


@dataclass(frozen=True)
class FlatInputs:
    """ids and positions [1, T], the PassInputs (RoPE angles only), each layer's FlatLayer, the token
    indices whose logits are wanted (chunk after chunk, in the caller's order) and each token's adapter."""

    ids: Tensor
    positions: Tensor
    ctx: PassInputs
    layers: list[FlatLayer]
    wanted: Tensor
    adapters: list[int]
    scales: list[float]


def by_length(chunks: list[Chunk]) -> list[list[int]]:
    """The chunks' indices grouped by token count (a group runs as rows x tokens, unpadded)."""
    groups: dict[int, list[int]] = {}
    for i, c in enumerate(chunks):
        groups.setdefault(len(c.tokens), []).append(i)
    return list(groups.values())


def flat_inputs(stack: Stack, cache: PagedKVCache, chunks: list[Chunk], groups: list[list[int]]) -> FlatInputs:
    """The inputs of one forward over `chunks` laid out as `groups` (lists of indices of equal-length chunks)."""
    config = stack.config
    windowed = [config.layer_window(i) is not None for i in range(len(cache))]
    ids, positions, cos, sin, scos, ssin = [], [], [], [], [], []
    parts: list[list] = [[] for _ in range(len(cache))]
    wanted: list[Tensor | None] = [None] * len(chunks)
    start = 0
    for group in groups:
        inputs = paged_inputs(stack, cache, [chunks[i] for i in group])
        rows, new = inputs.ids.shape
        _flatten(inputs, ids, positions, cos, sin, scos, ssin)
        for i, layer in enumerate(cache.layers(inputs.where)):
            ctx = inputs.ctx
            mask = ctx.window_mask if windowed[i] and ctx.window_mask is not None else ctx.mask
            parts[i].append((start, rows, new, layer, mask, ctx.bias, ctx.new_keys_only))
        flat = start + inputs.wanted[0] * new + inputs.wanted[1]  # the group's wanted tokens, row by row
        counts = [chunks[i].logits for i in group]
        for i, rows_wanted in zip(group, flat.split(counts)):
            wanted[i] = rows_wanted
        start += rows * new
    ctx = PassInputs(rope=_joined(cos, sin), sliding_rope=_joined(scos, ssin))
    adapters = [c.adapter for i in sum(groups, []) for c in [chunks[i]] for _ in c.tokens]
    scales = [c.adapter_scale for i in sum(groups, []) for c in [chunks[i]] for _ in c.tokens]
    return FlatInputs(torch.cat(ids, dim=1), torch.cat(positions, dim=1), ctx, [FlatLayer(p) for p in parts],
                      torch.cat(wanted), adapters, scales)


def _flatten(inputs: PagedInputs, ids: list, positions: list, cos: list, sin: list, scos: list, ssin: list) -> None:
    """Append one group's ids, positions [rows, new] and RoPE angles [rows, new, 1, d] as [1, rows * new, ...]."""
    ids.append(inputs.ids.reshape(1, -1))
    positions.append(inputs.positions.reshape(1, -1))
    for rope, c, s in ((inputs.ctx.rope, cos, sin), (inputs.ctx.sliding_rope, scos, ssin)):
        if rope is not None:
            c.append(rope[0].reshape(1, -1, *rope[0].shape[2:]))
            s.append(rope[1].reshape(1, -1, *rope[1].shape[2:]))


def _joined(cos: list[Tensor], sin: list[Tensor]) -> tuple[Tensor, Tensor] | None:
    return (torch.cat(cos, dim=1), torch.cat(sin, dim=1)) if cos else None
