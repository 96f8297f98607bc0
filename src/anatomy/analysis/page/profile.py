"""The profile page (`anatomy profile --html`): the measured run next to its roofs. Per phase the
reconciliation, the positions of the decoder's map (measured against the roofline), every op
placed on this machine's roofline at the FLOP/s it reached, and the op table; then the sweeps
(the --plot figure, embedded), the what-ifs and a named accelerator's prediction."""

from __future__ import annotations

import base64
from typing import Any

from anatomy.analysis.profile import render as profile_render
from anatomy.analysis.page import charts, svg
from anatomy.analysis.page.build import render_template

POSITION_SERIES = {key: k for k, key in enumerate(("qkv_ffn_gemm", "rope_attention", "residual_norm", "kv_cache",
                                                   "lm_head", "embedding"))}


def profile_page(report: dict[str, Any]) -> str:
    tables = profile_render.tables(report)
    return render_template(
        "profile.html.j2", report=report, title=f"anatomy profile of {report['model']['name']}",
        chips=_chips(report), phases=[_phase(report, phase, tables) for phase in report["phases"]],
        machine=tables[0], extra=[t for t in tables if t.title.startswith(("Sweep", "What if", "Predicted on"))],
        figure=_figure(report) if report.get("sweep") else "")


def _chips(report: dict[str, Any]) -> list[tuple[str, str]]:
    o, m = report["options"], report["machine"]
    out = [("parameters", f"{report['model']['parameters']:,}"), ("weights", o.get("weights", o["compute_dtype"])),
           ("B", str(o["batch"])), ("S", f"{o['prompt_len']:,}"), ("T", f"{o['context']:,}"),
           ("threads", str(o["threads"])), ("bandwidth", svg.si(m["bandwidth_bytes_per_s"], "B/s")),
           ("peak", svg.si(m["peak_flops_per_s"], "FLOP/s"))]
    for phase, d in report["phases"].items():
        eager = f"eager {d['eager_tok_per_s']:,.1f}, " if "production_step_s" in d else ""
        out.append((f"{phase} tok/s", f"{d['tok_per_s']:,.1f} ({eager}predicted {d['predicted_tok_per_s']:,.1f})"))
    return out


def _phase(report: dict[str, Any], phase: str, tables: list) -> dict[str, Any]:
    d = report["phases"][phase]
    mine = [t for t in tables if t.title.startswith(f"{phase}")]
    return {"name": phase, "data": d, "summary": mine[0], "positions_table": mine[1], "ops": mine[2], "miss": mine[3],
            "bars": _position_bars(report, d), "roofline": _roofline(report, phase, d)}


def _position_bars(report: dict[str, Any], d: dict[str, Any]) -> str:
    labels = report["positions"]
    roof: dict[str, float] = {}
    for o in d["ops"]:
        roof[o["position"]] = roof.get(o["position"], 0.0) + (o["roofline_s"] or 0.0)
    bars = []
    for key, seconds in d["positions"].items():
        if not seconds:
            continue
        label = labels[key]["label"]
        share = seconds / d["step_s"]
        bars.append(charts.Bar(label, seconds * 1e3, "fill-attention", f"{seconds * 1e3:,.2f} ms ({share:.1%})",
                               tip=f"{label}: {seconds * 1e3:,.3f} ms per step measured, "
                                   f"{roof.get(key, 0.0) * 1e3:,.3f} ms at the roofs\n{labels[key]['serves']}"))
        bars.append(charts.Bar("  at the roofs", roof.get(key, 0.0) * 1e3, "fill-base",
                               f"{roof.get(key, 0.0) * 1e3:,.2f} ms"))
    u = d["unattributed_s"]
    bars.append(charts.Bar("unattributed", u * 1e3, "fill-head", f"{u * 1e3:,.2f} ms ({u / d['step_s']:.1%})",
                           tip="the engine's Python between ops, outside every module"))
    return charts.bars_svg(bars, title="time per position")


def _roofline(report: dict[str, Any], phase: str, d: dict[str, Any]) -> str:
    m = report["machine"]
    labels = profile_render.ROOF_LABELS  # the integer products' roofs beside the float one
    hardware = {"name": "this machine", "peak_flops": m["peak_flops_per_s"], "bandwidth": m["bandwidth_bytes_per_s"],
                "more_peaks": {labels[k]: v for k, v in m["peak_flops_per_s_by_dtype"].items() if k in labels}}
    points = []
    for o in d["ops"]:
        if not o["flops"] or not o["bytes"] or not o["time_s"]:
            continue
        intensity = o["flops"] / o["bytes"]
        tip = (f"{o['module']} {o['op']} ({o['bound']})\n{svg.si(o['flops'], 'FLOP')} · {svg.si(o['bytes'], 'B')} "
               f"per step · intensity {intensity:.3g} FLOP/byte\nmeasured {o['time_s'] * 1e6:,.1f} us: "
               f"{svg.si(o['flops_per_s'], 'FLOP/s')}, {svg.si(o['bytes_per_s'], 'B/s')}\n"
               f"roofline {o['roofline_s'] * 1e6:,.1f} us")
        values = {"intensity": intensity, "bound": o["bound"], "flops": o["flops"], "bytes": o["bytes"],
                  "time_s": o["time_s"]}
        points.append(charts.RoofPoint(f"{o['module']} {o['op']}", phase, values,
                                       series=POSITION_SERIES.get(o["position"], 5), achieved=o["flops_per_s"],
                                       tip=tip))
    if not points:
        return ""
    return charts.roofline_svg(hardware, points, dtype=report["options"]["compute_dtype"])


def _figure(report: dict[str, Any]) -> str:
    from anatomy.analysis.profile.plot import png_bytes

    return "data:image/png;base64," + base64.b64encode(png_bytes(report)).decode("ascii")
