"""Memory sizes as users write them: bytes ("2GiB", "512MB", "1e9") or a fraction of the machine's memory ("0.1")."""

from __future__ import annotations

import os
import re

from anatomy.errors import InputError

UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6, "g": 10 ** 9, "gb": 10 ** 9,
         "t": 10 ** 12, "tb": 10 ** 12, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_bytes(text: str, *, option: str) -> int:
    """Bytes from '2GiB', '512MB', '1e9', '1048576', '0'; a fraction of physical memory from '0.1'.
    InputError naming `option` otherwise."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in UNITS:
        raise InputError(f"{option} {text!r} is not a size (2GiB, 512MB, 1e9) or a fraction of memory (0.1)")
    value = float(match.group(1))
    if unit == "" and 0 < value < 1:
        return int(value * physical_memory())
    if value != 0 and value < 1:
        raise InputError(f"{option} {text!r} must be 0, a size or a fraction in (0, 1)")
    return int(value * UNITS[unit])


def physical_memory() -> int:
    """The machine's physical memory in bytes (4 GiB where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 4 * 2 ** 30
