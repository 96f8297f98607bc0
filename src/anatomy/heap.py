"""Memory given back to the system: glibc keeps freed heap chunks for reuse, so a process that frees
a model's stored tensors while building their layouts would still hold their pages. `trim()` asks
glibc to return what is free (malloc_trim); elsewhere (another libc, another system) it does nothing.
`discard()` gives back the pages of memory still allocated whose contents are no longer needed;
`available()` is what the system can give now; a `Trimmer` trims once enough has been freed; `advise()`
passes other advice on a range (huge_pages.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import sys


@functools.cache
def _libc(function: str):
    """The C library's `function`, or None where there is no such library or function."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), function) if name else None
    except (OSError, AttributeError):
        return None


def trim() -> bool:
    """Return the heap's free pages to the system; whether the C library could."""
    fn = _libc("malloc_trim")
    return bool(fn(0)) if fn is not None else False


class Trimmer:
    """trim() once `every` bytes have been freed since the last trim, and at flush(): a trim costs about a
    millisecond, so trimming after each of a model's hundreds of freed weights adds up, while the heap
    keeps at most `every` freed bytes more in between."""

    def __init__(self, every: int = 32 << 20) -> None:
        self.every, self.pending = every, 0

    def freed(self, nbytes: int) -> None:
        self.pending += nbytes
        if self.pending >= self.every:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            trim()
        self.pending = 0


@functools.cache
def _madvise():
    """libc's madvise with its argument types set, on Linux (MADV_DONTNEED's meaning is Linux's)."""
    fn = _libc("madvise") if sys.platform.startswith("linux") else None
    if fn is not None:
        fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return fn


MADV_DONTNEED = 4  # Linux: the range's pages are dropped; read again, they are zeros
PAGE = mmap.PAGESIZE


def discards() -> bool:
    """Can discard() give pages back here?"""
    return _madvise() is not None


def discard(address: int, nbytes: int) -> int:
    """Give the whole pages inside [address, address + nbytes) back to the system; their contents are
    lost (they read as zeros). For memory that nothing reads again before it is freed. -> bytes given
    back (0 where the C library or the system has no madvise)."""
    fn = _madvise()
    start, stop = -(-address // PAGE) * PAGE, (address + nbytes) // PAGE * PAGE
    if fn is None or stop <= start:
        return 0
    return stop - start if fn(start, stop - start, MADV_DONTNEED) == 0 else 0


def advise(address: int, nbytes: int, advice: int) -> bool:
    """madvise(address, nbytes, advice) (Linux's values); whether the system took it."""
    fn = _madvise()
    return fn is not None and fn(address, nbytes, advice) == 0


def available() -> int | None:
    """Memory the OS can give now (Linux: MemAvailable, free pages plus reclaimable cache; elsewhere
    the free pages); None where it cannot say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
