"""Group scales factored per 256 inputs, as GGUF's K-quants store them.

    factor_groups(values [N, K/32]) -> (unit float16 [N, K/256], multiples uint8 [N, K/32]), or None

A Q4_K super-block of 256 inputs holds one float16 d and, per group of 32, a 6-bit sc: the group's scale
is d * sc (likewise -dmin * m its offset), which an Int4Weight holds as the product. The value of largest
magnitude is d times the largest sc (63 from llama.cpp's plain quantizer, up to 63 from its imatrix one),
so d is found by trying it over 63, 62, ...; the factoring holds only where every value is unit * an
integer 0..255 exactly in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

GROUPS = 8  # groups of 32 per super-block of 256 inputs
SUPER_BLOCK = 256  # inputs per K-quant super-block (Q4_K, Q5_K, Q6_K)
LARGEST = 63  # the largest multiple tried (K-quants' 6-bit scales)
SAMPLE = 64  # rows tried first: a weight that does not factor (a Q4_1 file's) is refused on them


def factor_groups(values: Tensor) -> tuple[Tensor, Tensor] | None:
    """values [N, K/32] (group scales or offsets) as unit [N, K/256] float16 times multiples [N, K/32] uint8,
    exactly in float32; None where they do not factor so (K not a multiple of 256, any value off)."""
    N, groups = values.shape
    if groups % GROUPS or not groups or not N:
        return None
    sample = torch.linspace(0, N - 1, min(N, SAMPLE), dtype=torch.float64).long().unique()
    if _factor(values[sample].float().reshape(-1, GROUPS)) is None:
        return None
    found = _factor(values.float().reshape(-1, GROUPS))  # (a copy where values are not contiguous)
    if found is None:
        return None
    unit, multiples = found
    return unit.half().view(N, groups // GROUPS), multiples.to(torch.uint8).view(N, groups)


def _factor(v: Tensor) -> tuple[Tensor, Tensor] | None:
    """Super-blocks v [B, 8] as unit [B] (float16 values, held in float32) times multiples [B, 8], or None."""
    high, low = v.amax(dim=1, keepdim=True), v.amin(dim=1, keepdim=True)
    if ((high > 0) & (low < 0)).any():  # both signs in one super-block: no unit gives multiples >= 0
        return None
    extreme = torch.where(high >= -low, high, low)  # [B, 1], signed
    unit, multiples, ok = _try(v, extreme, LARGEST)
    todo = (~ok).nonzero()[:, 0]
    for largest in range(LARGEST - 1, 0, -1):  # the super-blocks whose extreme is not 63 times their unit
        if not len(todo):
            break
        u, q, fits = _try(v[todo], extreme[todo], largest)
        unit[todo[fits]], multiples[todo[fits]] = u[fits], q[fits]
        todo = todo[~fits]
    return None if len(todo) else (unit[:, 0], multiples)


def _try(v: Tensor, extreme: Tensor, largest: int) -> tuple[Tensor, Tensor, Tensor]:
    """unit = extreme / largest as a float16, multiples = v / unit rounded, and which rows they reproduce
    (every value of a row has the extreme's sign, so the multiples are >= 0 and about largest at most)."""
    u = (extreme / largest).half().float()  # [B, 1]
    q = (v / torch.where(u == 0, 1.0, u)).round_()
    return u, q, torch.eq(q * u, v).all(dim=1)
