"""The page's charts as SVG, drawn from report values: the roofline (log-log), a treemap of the
parameter ledger, the 12·L·D² waterfall and horizontal bars. Hover text rides on `data-tip`;
roofline points carry the report's numbers in data attributes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from anatomy.analysis.page.svg import attrs, esc, num, short, si, text_width

# -- roofline -----------------------------------------------------------------------------------

W, H = 700, 430
LEFT, RIGHT, TOP, BOTTOM = 78, 24, 22, 54


@dataclass(frozen=True)
class RoofPoint:
    label: str  # "prefill", "decode", or "llama-7b decode"
    phase: str
    values: dict[str, Any]  # the report's roofline.<phase> dict
    series: int = -1  # a compare page's model index (colour), -1: by phase
    achieved: float | None = None  # a measured FLOP/s (the profile page's ops), drawn under the roof; None: on it
    tip: str = ""  # hover text instead of the roofline point's


def roofline_svg(hardware: dict[str, Any], points: list[RoofPoint], *, dtype: str) -> str:
    """`hardware`: name, peak_flops, bandwidth, and optionally more_peaks {label: FLOP/s}: further compute
    roofs (a profile's integer products), each drawn from its own ridge."""
    peak, bandwidth = hardware["peak_flops"], hardware["bandwidth"]
    more = hardware.get("more_peaks", {})
    ridge = peak / bandwidth
    xs = [p.values["intensity"] for p in points] + [ridge] + [v / bandwidth for v in more.values()]
    x_lo = 10 ** math.floor(math.log10(min(xs) / 3))
    x_hi = 10 ** math.ceil(math.log10(max(xs) * 3))
    y_hi = 10 ** math.ceil(math.log10(max([peak, *more.values()]) * 2))
    y_lo = 10 ** math.floor(math.log10(min(bandwidth * x_lo, *(_attained(p, peak, bandwidth) for p in points)) / 2))
    sx = _log_scale(x_lo, x_hi, LEFT, W - RIGHT)
    sy = _log_scale(y_lo, y_hi, H - BOTTOM, TOP)
    out = [f'<svg class="chart roofline" viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="roofline on {esc(hardware["name"])}">']
    out += _log_axes(sx, sy, x_lo, x_hi, y_lo, y_hi)
    out.append(f'<text class="axis-title" x="{(LEFT + W - RIGHT) / 2}" y="{H - 12}" text-anchor="middle">'
               "arithmetic intensity (FLOP / byte)</text>")
    out.append(f'<text class="axis-title" transform="translate(16 {(TOP + H - BOTTOM) / 2}) rotate(-90)" '
               'text-anchor="middle">attainable FLOP/s</text>')
    roof = [(x_lo, bandwidth * x_lo), (ridge, peak), (x_hi, peak)]
    d = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(roof))
    tip = (f"{hardware['name']}: peak {si(peak, 'FLOP/s')} ({dtype}, dense), bandwidth {si(bandwidth, 'B/s')}, "
           f"ridge {ridge:.3g} FLOP/byte")
    out.append(f'<path class="roof" d="{d}" data-tip="{esc(tip)}"/>')
    out.append(f'<line class="ridge" x1="{sx(ridge):.1f}" x2="{sx(ridge):.1f}" y1="{sy(peak):.1f}" '
               f'y2="{H - BOTTOM}"/>')
    out.append(f'<text class="roof-label" x="{sx(ridge) + 6:.1f}" y="{H - BOTTOM - 8}">ridge {ridge:.3g}</text>')
    for label, value in more.items():
        flat = f"M{sx(value / bandwidth):.1f},{sy(value):.1f} L{sx(x_hi):.1f},{sy(value):.1f}"
        out.append(f'<path class="roof roof-more" d="{flat}" data-tip="{esc(label)}: {si(value, "FLOP/s")}"/>')
    legend = [f"memory roof {si(bandwidth, 'B/s')} × intensity",
              f"compute roof {si(peak, 'FLOP/s')} ({dtype}, dense)"]
    legend += [f"compute roof {si(value, 'FLOP/s')} ({label}, dashed)" for label, value in more.items()]
    out += [f'<text class="roof-label" x="{LEFT + 12}" y="{TOP + 20 + 17 * k}">{esc(line)}</text>'
            for k, line in enumerate(legend)]
    out += [_point(p, sx, sy, peak, bandwidth, k) for k, p in enumerate(points)]
    out.append("</svg>")
    return "\n".join(out)


def _attained(p: RoofPoint, peak: float, bandwidth: float) -> float:
    return p.achieved if p.achieved is not None else min(peak, p.values["intensity"] * bandwidth)


def _log_scale(lo: float, hi: float, a: float, b: float) -> Callable[[float], float]:
    span = math.log10(hi) - math.log10(lo)
    return lambda v: a + (math.log10(v) - math.log10(lo)) / span * (b - a)


def _log_axes(sx, sy, x_lo, x_hi, y_lo, y_hi) -> list[str]:
    out = ['<g class="axis">']
    for e in range(round(math.log10(x_lo)), round(math.log10(x_hi)) + 1):
        x = sx(10 ** e)
        out.append(f'<line class="gridline" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}"/>')
        out.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">{esc(_tick(10.0 ** e))}</text>')
    for e in range(round(math.log10(y_lo)), round(math.log10(y_hi)) + 1):
        y = sy(10 ** e)
        out.append(f'<line class="gridline" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{esc(si(10.0 ** e))}</text>')
    out.append(f'<path d="M{LEFT},{TOP} V{H - BOTTOM} H{W - RIGHT}" fill="none"/></g>')
    return out


def _tick(v: float) -> str:
    return f"{v:g}" if v < 1000 else si(v)


POINT_KEYS = ("flops", "bytes", "intensity", "ridge", "time_s", "time_per_token_s", "tokens_per_s")


def _point(p: RoofPoint, sx, sy, peak: float, bandwidth: float, k: int) -> str:
    """A prefill circle or a decode diamond carrying the report's numbers (data-flops ...)."""
    v = p.values
    x, y = sx(v["intensity"]), sy(_attained(p, peak, bandwidth))
    tip = p.tip or (f"{p.label}: {v['bound']}-bound\n{si(v['flops'], 'FLOP')} · {si(v['bytes'], 'B')} moved\n"
                    f"intensity {v['intensity']:.3g} FLOP/byte (ridge {v['ridge']:.3g})\n"
                    f"step ≥ {si(v['time_s'], 's')} · {si(v['time_per_token_s'], 's')} per token · "
                    f"≤ {v['tokens_per_s']:,.1f} tok/s")
    data = " ".join(f'data-{key.replace("_", "-")}="{esc(num(v[key]))}"' for key in POINT_KEYS if key in v)
    if p.phase == "prefill":
        mark = f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="7.5"/>'
    else:
        mark = (f'<rect class="mark" x="{x - 6.5:.1f}" y="{y - 6.5:.1f}" width="13" height="13" '
                f'transform="rotate(45 {x:.1f} {y:.1f})"/>')
    css = f"point {p.phase}" + (f" series series-{p.series}" if p.series >= 0 else "")
    guide = f'<line class="guide" x1="{x:.1f}" x2="{x:.1f}" y1="{y + 8:.1f}" y2="{H - BOTTOM}"/>'
    label = (f'<text class="point-label" x="{x + 11:.1f}" y="{y - 10:.1f}">{esc(p.label)}</text>'
             if p.series < 0 else "")
    return (f'<g class="{css}" data-phase="{esc(p.phase)}" data-label="{esc(p.label)}" data-bound="{esc(v["bound"])}" '
            f'{data} data-tip="{esc(tip)}" tabindex="0">{guide}{mark}{label}</g>')


# -- treemap ------------------------------------------------------------------------------------

TREE_W, TREE_H = 600, 300


@dataclass(frozen=True)
class TreeItem:
    labels: tuple[str, ...]  # the longest first: a cell shows the first that fits
    value: int
    kind: str
    tip: str
    part: str | None = None  # the diagram part it belongs to


def treemap_svg(items: list[TreeItem], *, total: int) -> str:
    items = sorted((i for i in items if i.value > 0), key=lambda i: -i.value)
    rects = squarify([i.value for i in items], 0, 0, TREE_W, TREE_H)
    out = [f'<svg class="chart treemap" viewBox="0 0 {TREE_W} {TREE_H}" role="img" aria-label="parameter treemap">']
    for item, (x, y, w, h) in zip(items, rects):
        share = item.value / total
        rect = attrs(x=f"{x:.2f}", y=f"{y:.2f}", width=f"{w:.2f}", height=f"{h:.2f}")
        out.append(f'<g class="cell-group" data-part="{esc(item.part or "")}" data-value="{item.value}">'
                   f'<rect class="cell fill-{esc(item.kind)}" {rect} data-tip="{esc(item.tip)}"/>')
        out.append(_tree_labels(item, share, x, y, w, h))
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _tree_labels(item: TreeItem, share: float, x: float, y: float, w: float, h: float) -> str:
    second = f"{share:.1%} · {short(item.value)}"
    fits = [label for label in item.labels if label and text_width(label, 12, bold=True) + 12 <= w]
    if not fits or h < 22:
        return ""
    first = fits[0]
    out = f'<text x="{x + 7:.1f}" y="{y + 17:.1f}">{esc(first)}</text>'
    if w >= text_width(second, 12) + 12 and h >= 40:
        out += f'<text class="small" x="{x + 7:.1f}" y="{y + 33:.1f}">{esc(second)}</text>'
    return out


def squarify(values: list[float], x: float, y: float, w: float, h: float) -> list[tuple[float, float, float, float]]:
    """Squarified treemap (Bruls, Huizing, van Wijk): rectangles for values sorted large to small,
    filling (x, y, w, h), each as close to square as the order allows."""
    total = sum(values)
    if total <= 0:
        return []
    areas = [v * w * h / total for v in values]
    rects: list[tuple[float, float, float, float]] = []
    while areas:
        side = min(w, h)
        row = [areas.pop(0)]
        while areas and _worst(row + [areas[0]], side) <= _worst(row, side):
            row.append(areas.pop(0))
        s = sum(row)
        if w >= h:  # a column on the left
            dx, yy = s / h, y
            for a in row:
                rects.append((x, yy, dx, a / dx))
                yy += a / dx
            x, w = x + dx, w - dx
        else:  # a row on top
            dy, xx = s / w, x
            for a in row:
                rects.append((xx, y, a / dy, dy))
                xx += a / dy
            y, h = y + dy, h - dy
    return rects


def _worst(row: list[float], side: float) -> float:
    s = sum(row)
    return max(max(side * side * a / (s * s), s * s / (side * side * a)) for a in row)


# -- horizontal bars and the waterfall ----------------------------------------------------------

@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    css: str = "fill-attention"
    text: str = ""  # the value as shown; default: short(value)
    start: float = 0.0  # a floating bar (waterfall) starts here
    tip: str = ""


def bars_svg(bars: list[Bar], *, width: int = 600, row: int = 28, label_width: float | None = None,
             title: str = "") -> str:
    """One horizontal bar per row: label on the left, bar, value on the right."""
    label_w = label_width or max(text_width(b.label, 12) for b in bars) + 14
    value_w = max(text_width(b.text or short(b.value), 12) for b in bars) + 16
    lo = min([0.0] + [min(b.start, b.start + b.value) for b in bars])
    hi = max([0.0] + [max(b.start, b.start + b.value) for b in bars]) or 1.0
    x0, x1 = label_w, width - value_w
    sx = lambda v: x0 + (v - lo) / (hi - lo) * (x1 - x0)  # noqa: E731
    height = row * len(bars) + 8
    out = [f'<svg class="chart bars" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title or "bars")}">']
    for k, b in enumerate(bars):
        y = 4 + k * row
        a, z = sorted((sx(b.start), sx(b.start + b.value)))
        out.append(f'<text class="bar-label" x="{label_w - 10:.1f}" y="{y + row / 2 + 4:.1f}" text-anchor="end">'
                   f"{esc(b.label)}</text>")
        tip = b.tip or f"{b.label}: {b.text or short(b.value)}"
        out.append(f'<rect class="bar {esc(b.css)}" x="{a:.1f}" y="{y + 5:.1f}" width="{max(z - a, 1.5):.1f}" '
                   f'height="{row - 10}" rx="3" data-tip="{esc(tip)}"/>')
        out.append(f'<text class="value-label" x="{max(a, z) + 6:.1f}" y="{y + row / 2 + 4:.1f}">'
                   f"{esc(b.text or short(b.value))}</text>")
    out.append("</svg>")
    return "\n".join(out)


DIFFERENCE_LABELS = {"embedding": "embeddings", "head": "untied head", "norm": "norms", "bias": "biases",
                     "attention_not_4D2": "attention ≠ 4D²", "ffn_not_8D2": "FFN ≠ 8D²",
                     "cross_attention": "cross-attention"}


def waterfall_svg(params: dict[str, Any]) -> str:
    """12·L·D², then each cause of the difference, ending at the exact total."""
    approx = params["approx_12ld2"]
    bars = [Bar("12·L·D²", approx, "fill-base", f"{approx:,}", tip=f"12·L·D² = {approx:,}")]
    running = approx
    for key, delta in params["difference_explained"].items():
        if delta:
            label = DIFFERENCE_LABELS.get(key, key.replace("_", " "))
            bars.append(Bar(label, delta, "fill-good" if delta > 0 else "fill-bad", f"{delta:+,}", start=running,
                            tip=f"{label}: {delta:+,} parameters"))
            running += delta
    total = params["total"]
    bars.append(Bar("exact total", total, "fill-attention", f"{total:,}", tip=f"exact total = {total:,}"))
    return bars_svg(bars, title="from 12·L·D² to the exact count")
