"""The comparison page's content: headline figures in columns, the diagrams side by side, the
parameter composition of each model, and every model's prefill and decode on one roofline."""

from __future__ import annotations

from typing import Any

from anatomy.analysis.page import charts, svg
from anatomy.analysis.page.build import KIND_LABELS, kind_class, render_template, summary
from anatomy.analysis.page.diagram import diagram_svg

# (label, path into the report, format)
ROWS = (
    ("architecture", ("model", "architecture"), "str"),
    ("layers", ("model", "config", "n_layers"), "int"),
    ("D (d_model)", ("model", "config", "d_model"), "int"),
    ("heads H / H_kv", None, "heads"),
    ("parameters", ("params", "total"), "count"),
    ("per layer", ("params", "per_layer"), "count"),
    ("12·L·D²", ("params", "approx_12ld2"), "count"),
    ("forward FLOPs [B, S]", ("flops", "forward"), "flop"),
    ("forward FLOPs per token", ("flops", "forward_per_token"), "flop"),
    ("training FLOPs per token", ("flops", "training_per_token"), "flop"),
    ("weights", ("memory", "weights_bytes"), "bytes"),
    ("KV cache per token", ("memory", "kv_cache_bytes_per_token"), "bytes"),
    ("KV cache at (B, T)", ("memory", "kv_cache_bytes"), "bytes"),
    ("prefill bound", ("roofline", "prefill", "bound"), "str"),
    ("prefill tok/s bound", ("roofline", "prefill", "tokens_per_s"), "rate"),
    ("decode bound", ("roofline", "decode", "bound"), "str"),
    ("decode tok/s bound", ("roofline", "decode", "tokens_per_s"), "rate"),
    ("decode compute-bound from batch", ("roofline", "decode_compute_bound_batch"), "batch"),
)
_MISSING = object()


def compare_context(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    names = list(reports)
    first = next(iter(reports.values()))
    hardware = first["roofline"]["hardware"]
    points = [charts.RoofPoint(f"{name} {phase}", phase, r["roofline"][phase], series=k)
              for k, (name, r) in enumerate(reports.items())
              for phase in ("prefill", "decode") if phase in r["roofline"]]
    return {
        "title": "anatomy compare: " + " vs ".join(names),
        "names": names,
        "reports": reports,
        "summaries": {name: summary(r) for name, r in reports.items()},
        "rows": [(label, [_cell(r, path, fmt) for r in reports.values()]) for label, path, fmt in ROWS],
        "options": [(name, r["options"]) for name, r in reports.items()],
        "diagrams": {name: diagram_svg(r, compact=True, uid=f"m{k}") for k, (name, r) in enumerate(reports.items())},
        "composition": composition_svg(reports),
        "roofline": charts.roofline_svg(hardware, points, dtype=first["options"]["compute_dtype"]),
        "hardware": hardware,
        "kinds": [k for k in KIND_LABELS if any(v for r in reports.values() for kind, v in r["params"]["by_kind"].items()
                                                if kind_class(kind) == k)],
    }


def _cell(report: dict[str, Any], path: tuple[str, ...] | None, fmt: str) -> str:
    if fmt == "heads":
        c = report["model"]["config"]
        return f"{c['n_heads']} / {c['n_kv_heads']}"
    value: Any = report
    for key in path or ():
        if not isinstance(value, dict) or key not in value:
            return "–"  # not applicable: an encoder has no decode step
        value = value[key]
    if fmt == "batch":
        return "never" if value is None else f"{value:,}"
    formats = {"str": str, "int": lambda v: f"{v:,}", "count": lambda v: f"{v:,}", "flop": lambda v: svg.si(v, "FLOP"),
               "bytes": svg.binary, "rate": lambda v: f"{v:,.1f}"}
    return formats[fmt](value)


def composition_svg(reports: dict[str, dict[str, Any]], *, width: int = 900, row: int = 34) -> str:
    """One 100% bar per model, split by kind of parameter, with its total on the right."""
    label_w = max(svg.text_width(name, 13, bold=True) for name in reports) + 18
    total_w = 110
    x0, x1 = label_w, width - total_w
    height = row * len(reports) + 6
    out = [f'<svg class="chart composition" viewBox="0 0 {width} {height}" role="img" '
           'aria-label="parameter composition">']
    for k, (name, r) in enumerate(reports.items()):
        y = 3 + k * row
        total = r["params"]["total"]
        out.append(f'<text class="bar-label" x="{label_w - 10:.1f}" y="{y + row / 2 + 4:.1f}" text-anchor="end" '
                   f'font-weight="600">{svg.esc(name)}</text>')
        x = x0
        for kind, value in r["params"]["by_kind"].items():
            if not value:
                continue
            w = value / total * (x1 - x0)
            tip = f"{name}: {KIND_LABELS.get(kind, kind)} {value:,} ({value / total:.1%})"
            out.append(f'<rect class="bar fill-{kind_class(kind)}" x="{x:.2f}" y="{y + 5}" width="{w:.2f}" '
                       f'height="{row - 10}" data-tip="{svg.esc(tip)}"/>')
            if w > svg.text_width(f"{value / total:.0%}", 11.5) + 8:
                out.append(f'<text class="segment-label" x="{x + w / 2:.1f}" y="{y + row / 2 + 4:.1f}" '
                           f'text-anchor="middle">{value / total:.0%}</text>')
            x += w
        out.append(f'<text class="value-label" x="{x1 + 8:.1f}" y="{y + row / 2 + 4:.1f}">{svg.short(total)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def compare_page(reports: dict[str, dict[str, Any]]) -> str:
    """Several reports side by side (`anatomy compare A B C --html`)."""
    return render_template("compare.html.j2", **compare_context(reports))
