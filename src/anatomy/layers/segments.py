"""The keys and values of a flat batch: groups of rows laid end to end on one token axis.

One serving step runs its decode rows, verification rows and prefill chunks as one sequence of T
tokens [1, T, D]: every projection sees all of them at once. Attention cannot: each row attends
over its own cache. A `Segments` holds, per group of rows of one length, where its tokens lie on the
axis, its keys and values (a paged cache's, in its rows' layout) and its mask; attention runs group
by group and lays the outputs back end to end (vLLM's varlen attention, one call per group).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from torch import Tensor


@dataclass(frozen=True)
class Segment:
    """Tokens [start, start + rows * new) of the axis, as `rows` rows of `new` tokens; k and v (Tensor,
    Pages or Codes) [rows, H_kv, T_g, d_h]; mask [rows, 1, new, T_g] and ALiBi bias over those keys;
    `causal`: a fresh prompt's group, whose k and v are its own new ones (PassInputs.new_keys_only)."""

    start: int
    rows: int
    new: int
    k: Any
    v: Any
    mask: Tensor | None = None
    bias: Tensor | None = None
    causal: bool = False


@dataclass(frozen=True)
class Segments:
    parts: tuple[Segment, ...]

    def map(self, fn: Callable[[Any, Any], tuple[Any, Any]]) -> Segments:
        """The same groups with each one's (k, v) replaced by fn(k, v)."""
        return Segments(tuple(replace(p, **dict(zip("kv", fn(p.k, p.v)))) for p in self.parts))

    def attend(self, q: Tensor, attend: Callable[..., tuple[Tensor, Any]]) -> Tensor:
        """q [1, H, T, d_h] -> [1, H, T, d_v]: attend(q_g, k_g, v_g, mask=, bias=, causal=) of each group."""
        outs = []
        for p in self.parts:
            out, _ = attend(rows_of(q, p.start, p.rows, p.new), p.k, p.v, mask=p.mask, bias=p.bias, causal=p.causal)
            outs.append(out.transpose(0, 1).reshape(1, out.shape[1], p.rows * p.new, out.shape[-1]))
        return torch.cat(outs, dim=2)


def rows_of(x: Tensor, start: int, rows: int, new: int) -> Tensor:
    """Tokens [start, start + rows * new) of x [1, H, T, d] as [rows, H, new, d]."""
    part = x[0, :, start:start + rows * new]  # [H, rows * new, d]
    return part.reshape(x.shape[1], rows, new, x.shape[-1]).transpose(0, 1)
