"""anatomy's own kernels (gemv.cpp, gemv_avx2.cpp, ...): few-row products on int4 and int8 groups through
AVX-512 VNNI or AVX2, decode attention, RMSNorm and a whole decode block as one operator.

    loaded()         True when `make` built the library for this source and torch version (build.py)
                     and it loaded: torch.ops.anatomy.q4_linear, q8_linear, pack_q4, pack_q8, isa, ...
    isa()            the vector code they run: "avx512-vnni", "avx512", "avx2" or "portable"
    available()      loaded, and a vector path runs (AVX2 at least): the kernel plan then measures them
                     against torch's kernels like any other candidate
    limited(name)    a context in which they run at most that code (the tests' way to run the AVX2 and
                     portable paths on an AVX-512 machine); $ANATOMY_NATIVE_ISA sets the same limit
                     for a whole process, e.g. to see what a machine without AVX-512 would choose

They are an option, never a requirement: without the library (a wheel installed elsewhere, a failed
build, an older CPU) the candidates are simply not offered.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch

from anatomy.errors import InputError
from anatomy.kv_format import Codes, Pages

ISAS = ("portable", "avx2", "avx512", "avx512-vnni")  # native.h's Isa, by its value
ISA_ENV = "ANATOMY_NATIVE_ISA"


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
    if os.environ.get(ISA_ENV):
        _set_limit(os.environ[ISA_ENV], f"${ISA_ENV}")
    return True


def read_cache(q: torch.Tensor, k, v, *, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Attention of q [B, H, S, d_h] over a cache's k, v [B, H_kv, T, d_h] read as stored
    (anatomy::decode_attention): float32, bfloat16 or float16 tensors, an 8-bit cache's Codes, or a paged
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


def isa() -> str:
    """The vector code the library runs (native.h's Isa: this CPU's, or less under a limit); "portable"
    without the library."""
    return ISAS[int(torch.ops.anatomy.isa())] if loaded() else "portable"


@contextlib.contextmanager
def limited(name: str) -> Iterator[str]:
    """Run the kernels with at most the vector code `name` (one of ISAS) inside; yields the code they
    then run (never more than the CPU has)."""
    if not loaded():
        yield "portable"
        return
    before = _set_limit(name, "native.limited")
    try:
        yield isa()
    finally:
        torch.ops.anatomy.set_isa_limit(before)


def _set_limit(name: str, where: str) -> int:
    """Limit the kernels to the vector code `name`; the limit it replaces (native.h's Isa value)."""
    if name not in ISAS:
        raise InputError(f"{where}={name!r}: not a vector code of anatomy's kernels; one of {', '.join(ISAS)}")
    return int(torch.ops.anatomy.set_isa_limit(ISAS.index(name)))


def available() -> bool:
    """Loaded, and this CPU runs a vector path (the portable loops are for checking them only)."""
    return isa() != "portable"
