"""A table of the report (title, columns, rows, notes) and the number formats its cells use."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TableSpec:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def count(n: float) -> str:
    return f"{int(n):,}"


def si(n: float, unit: str = "") -> str:
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}".strip()


def nbytes(n: float) -> str:
    for factor, unit in ((2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if n >= factor:
            return f"{int(n):,} B ({n / factor:.2f} {unit})"
    return f"{int(n):,} B"
