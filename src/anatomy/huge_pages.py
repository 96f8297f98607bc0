"""Weights on transparent huge pages (Linux): a decode step streams every weight layout once a token; on
4 KiB pages each page takes a TLB entry and the hardware prefetchers stop at each page's end.

    placed = huge_pages.hold(tensors)   # bytes now in ranges advised or collapsed onto 2 MiB pages

A tensor alone on its storage and under `large` bytes is copied, in order, into chunks of anonymous memory
advised MADV_HUGEPAGE and takes the copy in place (Tensor.set_: its holders read the same values from the
new bytes), the old storage freed as they go; any other (large, or with views) is collapsed where it lies
(MADV_COLLAPSE, Linux 6.1+). Memory torch's allocator did not give (a file's map, a chunk), opaque tensors
(oneDNN's) and parameters that train are left alone; a system that refuses a map stops the moves.
"""

from __future__ import annotations

import mmap
import sys
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from anatomy import heap

HUGE = 2 << 20  # bytes of an x86-64 (and arm64 4K-granule) transparent huge page
CHUNK = 64 << 20  # bytes of one chunk the small tensors are copied into
SMALLEST = 64 << 10  # smaller tensors are not worth a move
ALIGN = 64  # each copy starts on a cache line
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # Linux's advice values
SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def offered() -> bool:
    """Does this system give a process huge pages it asks for (Linux, THP not `never`)?"""
    if not sys.platform.startswith("linux") or not heap.discards():
        return False
    try:
        return "[never]" not in SETTING.read_text()
    except OSError:
        return False


def hold(tensors: Iterable[Tensor], *, large: int = CHUNK) -> int:
    """Move the CPU tensors' bytes onto huge pages where they may move, and collapse the huge pages inside
    those that may not (views of them elsewhere) or are `large` (the module's docstring); -> the bytes
    placed in ranges advised or collapsed onto huge pages (0 where the system offers none)."""
    if not offered():
        return 0
    mine = [t for t in tensors if _ours(t)]
    small = [t for t in mine if _alone(t) and _nbytes(t) < large]
    moved_ids = {id(t) for t in small}
    stay = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in mine if id(t) not in moved_ids}
    placed = sum(_collapse(s.data_ptr(), s.nbytes()) for s in stay.values())
    trimmer = heap.Trimmer()
    while small:
        try:
            advised, count = _fill_chunk(small, trimmer)
        except OSError:  # no map (an address-space limit, strict overcommit): the rest stay where they are
            break
        placed += advised
        small = small[count:]
    trimmer.flush()
    return placed


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _ours(t: Tensor) -> bool:
    """A strided CPU tensor worth the move, on memory torch's allocator gave (not a file's map, not a chunk
    here), not a parameter that trains."""
    if t.device.type != "cpu" or t.layout != torch.strided or t.is_mkldnn or t.is_quantized or t.requires_grad:
        return False
    return _nbytes(t) >= SMALLEST and t.untyped_storage().resizable()


def _alone(t: Tensor) -> bool:
    """Does t fill a storage no other tensor holds (so that moving it frees the old one)?"""
    return t.is_contiguous() and not t.storage_offset() and t.untyped_storage().nbytes() == _nbytes(t) \
        and _users(t) == 1


def _users(t: Tensor) -> int:
    """How many tensors hold t's storage (torch's count, less the one the query itself adds); a torch
    without the count gives 0 and nothing moves."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return count(t.untyped_storage()._cdata) - 1 if count is not None else 0


def _collapse(address: int, nbytes: int) -> int:
    """Collapse the whole huge pages inside [address, address + nbytes); -> their bytes (0 if refused)."""
    start, stop = -(-address // HUGE) * HUGE, (address + nbytes) // HUGE * HUGE
    return stop - start if stop > start and heap.advise(start, stop - start, MADV_COLLAPSE) else 0


def _fill_chunk(tensors: list[Tensor], trimmer: heap.Trimmer) -> tuple[int, int]:
    """Copy the first tensors that fit into one new chunk; -> (its bytes advised, tensors moved)."""
    sizes = []
    total = 0
    for t in tensors:
        size = -(-_nbytes(t) // ALIGN) * ALIGN
        if sizes and total + size > CHUNK:
            break
        sizes.append(size)
        total += size
    pages = -(-total // HUGE) * HUGE  # the last huge page is whole (at most 2 MiB unused)
    chunk = mmap.mmap(-1, pages + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory = torch.frombuffer(chunk, dtype=torch.uint8)  # its storage keeps the map alive (never closed)
    skip = -memory.data_ptr() % HUGE  # the chunk's first huge page boundary
    chunk.madvise(MADV_HUGEPAGE, skip, pages)  # its pages are huge from their first touch, where Linux has them
    at = skip
    for t, size in zip(tensors, sizes):
        n = _nbytes(t)
        memory[at:at + n].copy_(t.detach().reshape(-1).view(torch.uint8))
        with torch.inference_mode(t.is_inference()), torch.no_grad():
            t.set_(memory.untyped_storage(), at // t.element_size(), t.shape, t.stride())
        trimmer.freed(n)
        at += size
    _collapse(memory.data_ptr() + skip, pages)  # those that were not (Linux 6.1+)
    return pages, len(sizes)
