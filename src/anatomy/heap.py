"""Memory given back to the system: glibc keeps freed heap chunks for reuse, so a process that frees
a model's stored tensors while building their layouts would still hold their pages. `trim()` asks
glibc to return what is free (malloc_trim); elsewhere (another libc, another system) it does nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim") if name else None
    except (OSError, AttributeError):
        return None


def trim() -> bool:
    """Return the heap's free pages to the system; whether the C library could."""
    fn = _libc_trim()
    return bool(fn(0)) if fn is not None else False
