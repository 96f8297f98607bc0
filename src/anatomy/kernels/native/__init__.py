"""anatomy's own kernels (gemv.cpp, tiles.cpp, ...): few-row products on int4/5/6/8 groups through
AVX-512 (VNNI) or AVX2, decode attention, RMSNorm and a whole decode block as one operator.

    loaded() / why_not()   the library of this source and torch version loaded (else why not, or "")
    causal(q, k, v, scale) a prompt's causal attention over its own keys (anatomy::causal_attention)
    isa()                  the vector code they run: "amx", "avx512-vnni", "avx512", "avx2" or "portable"
    runs(name)             they run that code or more ("avx512-vnni" on an AMX machine too)
    vector_paths()         the portable loops and each vector path up to this CPU's (AMX aside)
    available()            loaded with a vector path: the kernel plan then measures them like any candidate
    limited(name)          a context running at most that code ($ANATOMY_NATIVE_ISA: the same per process)

They are an option, never a requirement: without them the candidates are not offered, and the
first call that finds so says why once per process (a RuntimeWarning).
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import threading
import warnings
from collections.abc import Iterator

import torch

from anatomy.errors import InputError
from anatomy.kv_format import Codes, Pages

ISAS = ("portable", "avx2", "avx512", "avx512-vnni", "amx")  # native.h's Isa, by its value: each includes those before it
ISA_ENV = "ANATOMY_NATIVE_ISA"
SPEED = "decoding runs on torch's kernels, ~0.6x the speed"  # what the notice says is at stake
CAUSAL_MAX_DIM = 256  # the largest head dim anatomy::causal_attention takes (causal.cpp's MAX_DIM)

_state = {"why": "", "said": False, "limits": 0}  # for the process: why not; notice given; limited() depth
_lock = threading.Lock()


def loaded() -> bool:
    """Is the library of this source and torch version found (or compiled on first use) and loaded
    (torch.ops.anatomy.*)?"""
    with _lock:  # one first-use build, whichever thread asks first
        return _load()


@functools.cache
def _load() -> bool:
    from anatomy.kernels.native import library

    path, why = library.obtain()
    if path is not None:
        try:
            torch.ops.load_library(str(path))
        except (OSError, RuntimeError) as exc:
            path, why = None, f"torch could not load {path}: {str(exc).splitlines()[0]}"
    if path is None:
        _unavailable(why)
        return False
    if os.environ.get(ISA_ENV):
        _set_limit(os.environ[ISA_ENV], f"${ISA_ENV}")
    return True


def why_not() -> str:
    """Why the kernels are not loaded, or why this CPU runs no vector path of theirs; "" when they run
    (a limit set by $ANATOMY_NATIVE_ISA or limited() is not a reason)."""
    if not loaded():
        return _state["why"]
    if isa() != "portable" or os.environ.get(ISA_ENV) or _state["limits"]:
        return ""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"their vector code is x86-64's; this {platform.machine()} CPU runs their portable loops only"
    return "this CPU has no AVX2 (with FMA and F16C); their portable loops only check the vector paths"


def _unavailable(why: str) -> None:
    """Say once per process that the kernels cannot run here, why, and what it costs."""
    _state["why"] = why
    if why and not _state["said"]:
        _state["said"] = True
        warnings.warn(f"native kernels unavailable ({why}); {SPEED}; `anatomy doctor` says more", RuntimeWarning,
                      stacklevel=4)


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


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale, causal) v for float32 q [B, H, S, d_h] over k, v [B, H_kv, T, d_h], T >= S (row s
    sees keys t <= s + T - S), the query heads of a KV group reading its keys (anatomy::causal_attention)."""
    return torch.ops.anatomy.causal_attention(q, k, v, scale)


def isa() -> str:
    """The vector code the library runs (native.h's Isa: this CPU's, or less under a limit); "portable"
    without the library."""
    return ISAS[int(torch.ops.anatomy.isa())] if loaded() else "portable"


def vector_paths() -> tuple[str, ...]:
    """The portable loops and each vector code up to this CPU's, but AMX, whose one operator
    (tiles_amx_linear) is not a path of the others: what a test of every path runs them on."""
    return ISAS[:min(ISAS.index(isa()), ISAS.index("avx512-vnni")) + 1]


def runs(name: str) -> bool:
    """Do the kernels run the vector code `name` (one of ISAS) or more?"""
    return ISAS.index(isa()) >= ISAS.index(name)


@contextlib.contextmanager
def limited(name: str) -> Iterator[str]:
    """Run the kernels with at most the vector code `name` (one of ISAS) inside; yields the code they
    then run (never more than the CPU has)."""
    if not loaded():
        yield "portable"
        return
    before = _set_limit(name, "native.limited")
    _state["limits"] += 1
    try:
        yield isa()
    finally:
        _state["limits"] -= 1
        torch.ops.anatomy.set_isa_limit(before)


def _set_limit(name: str, where: str) -> int:
    """Limit the kernels to the vector code `name`; the limit it replaces (native.h's Isa value)."""
    if name not in ISAS:
        raise InputError(f"{where}={name!r}: not a vector code of anatomy's kernels; one of {', '.join(ISAS)}")
    return int(torch.ops.anatomy.set_isa_limit(ISAS.index(name)))


def available() -> bool:
    """Loaded, and this CPU runs a vector path (the portable loops are for checking them only); where it
    does not, says so once (why_not)."""
    running = isa() != "portable"
    if not running:
        _unavailable(why_not())
    return running
