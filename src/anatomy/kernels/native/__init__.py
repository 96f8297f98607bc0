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


def available() -> bool:
    """Loaded, and this CPU runs its AVX-512 VNNI paths (the portable ones are for checking them only)."""
    return loaded() and bool(torch.ops.anatomy.vnni())
