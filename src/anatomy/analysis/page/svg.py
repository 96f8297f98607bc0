"""Small helpers for hand-written SVG: escaping, attribute lists, a text-width estimate, number
formats for labels."""

from __future__ import annotations

import json
from html import escape


def esc(text: object) -> str:
    return escape(str(text), quote=True)


def attrs(**values: object) -> str:
    """key=value pairs as SVG/HTML attributes; underscores become dashes, None is left out."""
    return " ".join(f'{k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in values.items() if v is not None)


def num(value: float) -> str:
    """A number as JSON writes it: data attributes carry the report's exact values."""
    return json.dumps(value)


def text_width(text: str, size: float, *, bold: bool = False) -> float:
    """A generous estimate of the rendered width in px (wide sans fonts such as DejaVu Sans, whose
    average advance is ~0.6 em); boxes are sized from it, and the browser tests check the real fit."""
    wide = sum(1 for ch in text if ch.isupper() or ch in "mwMW@%")
    narrow = sum(1 for ch in text if ch in " .,:;'|!il()[]·")
    em = 0.62 * (len(text) - wide - narrow) + 0.78 * wide + 0.34 * narrow
    return em * size * (1.07 if bold else 1.0)


def short(n: float) -> str:
    """1,234,567 -> '1.23 M'; small counts as they are."""
    n = float(n)
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            value = n / factor
            return f"{value:.3g} {suffix}" if value < 1000 else f"{value:,.0f} {suffix}"
    return f"{n:,.0f}"


def si(n: float, unit: str = "") -> str:
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.3g} {prefix}{unit}"
    if 0 < abs(n) < 1:
        for factor, prefix in ((1e-3, "m"), (1e-6, "µ"), (1e-9, "n")):
            if abs(n) >= factor:
                return f"{n / factor:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}".strip()


def binary(n: float) -> str:
    for factor, unit in ((2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if n >= factor:
            return f"{n / factor:.3g} {unit}"
    return f"{int(n):,} B"


def arrow_marker(marker_id: str, css_class: str) -> str:
    return (f'<marker id="{marker_id}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
            f'orient="auto-start-reverse" class="{css_class}"><path d="M0,1 L10,5 L0,9 z"/></marker>')
