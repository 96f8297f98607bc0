"""anatomy's own kernels (gemv.cpp): few-row products on int4 and int8 groups through AVX-512 VNNI.

    loaded()         True when `make` built the library for this source and torch version (build.py)
                     and it loaded: torch.ops.anatomy.q4_linear, q8_linear, pack_q4, pack_q8, vnni
    available()      loaded, and this CPU has AVX-512 VNNI: the kernel plan then measures them against
                     torch's kernels like any other candidate

They are an option, never a requirement: without the library (a wheel installed elsewhere, a failed
build, an older CPU) the candidates are simply not offered.
"""

from __future__ import annotations

import functools

import torch

from anatomy.kv_format import Codes, Pages


@functools.cache
def loaded() -> bool:
    """Is the library built for this source and torch version, and loaded (torch.ops.anatomy.*)?"""
    from anatomy.kernels.native.build import library_path

    path = library_path()
    if not path.exists():
        return False
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError):
        return False
    return True


def read_cache(q: torch.Tensor, k, v, *, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Attention of q [B, H, S, d_h] over a cache's k, v [B, H_kv, T, d_h] read as stored
    (anatomy::decode_attention): float32 or bfloat16 tensors, an 8-bit cache's Codes, or a paged
    cache's Pages (pools [N, bs, H_kv, d_h] read through their tables [B, nb], T = nb * bs); the query
    heads of a KV group folded into its rows, mask [B|1, 1, S, T] additive -> [B, H, S, d_h]."""
    B, H, S, d = q.shape
    H_kv = k.codes.shape[1] if isinstance(k, Codes) else k.pool.shape[2] if isinstance(k, Pages) else k.shape[1]
    rep = H // H_kv
    folded = q.reshape(B, H_kv, rep * S, d)  # [B, H_kv, rep*S, d_h]
    if mask is not None and S > 1:
        mask = mask.repeat(1, 1, rep, 1)  # [B|1, 1, rep*S, T]
    if isinstance(k, Codes):
        out = torch.ops.anatomy.decode_attention(folded, k.codes, v.codes, k.scale, v.scale, mask, k.lut, scale)
    elif isinstance(k, Pages):
        out = torch.ops.anatomy.decode_attention(folded, k.pool, v.pool, None, None, mask, None, scale,
                                                 tables=k.tables)
    else:
        out = torch.ops.anatomy.decode_attention(folded, k, v, None, None, mask, None, scale)
    return out.reshape(B, H, S, d)


def available() -> bool:
    """Loaded, and this CPU runs its AVX-512 VNNI paths (the portable ones are for checking them only)."""
    return loaded() and bool(torch.ops.anatomy.vnni())
