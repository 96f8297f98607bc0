"""`anatomy profile`'s report as tables (rich in the terminal, or Markdown): the machine's roofs,
per phase the reconciliation, the positions of the map and every op, the prediction's miss, the
sweeps, the what-ifs and a named accelerator's prediction."""

from __future__ import annotations

from typing import Any

from anatomy.analysis.render import markdown_tables, print_tables
from anatomy.analysis.tables import TableSpec, count, si


def us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f}"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.2f}"


def _rate(value: float | None, unit: str) -> str:
    return "-" if value is None else si(value, unit)


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def tables(report: dict[str, Any]) -> list[TableSpec]:
    out = [_machine(report)]
    for phase, d in report["phases"].items():
        out += [_summary(phase, d, report), _positions(phase, d, report), _ops(phase, d), _miss(phase, d)]
    for key in sweep_keys(report):
        out.append(_sweep(key, report))
    for what_if in report.get("what_if", []):
        out.append(_what_if(what_if, report))
    if "hardware" in report:
        out.append(_hardware(report["hardware"]))
    return out


ROOF_LABELS = {"int8": "integer products peak, int8 (VNNI)", "amx": "integer products, AMX (q8 tiles)"}


def _machine(report: dict[str, Any]) -> TableSpec:
    m = report["machine"]
    t = TableSpec("This machine, measured in this run", ["roof", "value"])
    t.rows = [["memory read bandwidth", _rate(m["bandwidth_bytes_per_s"], "B/s")]]
    t.rows += [[ROOF_LABELS.get(d, f"matmul peak, {d}"), _rate(v, "FLOP/s")]
               for d, v in m["peak_flops_per_s_by_dtype"].items() if d != "any"]
    t.rows += [["ridge (peak / bandwidth)", f"{m['ridge_flops_per_byte']:.3g} FLOP/byte"],
               ["one small op (dispatch latency)", f"{m['op_latency_s'] * 1e6:.2f} us"]]
    o = report["options"]
    t.notes.append(f"{m['source']}; {o['threads']} threads; compute dtype {o['compute_dtype']}")
    if m.get("load", {}).get("note"):
        t.notes.append("warning: " + m["load"]["note"])
    return t


def _summary(phase: str, d: dict[str, Any], report: dict[str, Any]) -> TableSpec:
    o = report["options"]
    shape = f"B={o['batch']}, S={o['prompt_len']}" if phase == "prefill" else f"B={o['batch']}, T={o['context']}"
    t = TableSpec(f"{phase} [{shape}]: where a step's time goes", ["quantity", "ms per step", "share"])
    step = d["step_s"]
    t.rows = [
        ["step, profiled (the rows below add up to it)", ms(step), "100%"],
        ["  ops (each module's Python between its ops included)", ms(d["ops_s"]), _share(d["ops_s"], step)],
        ["  unattributed (the engine's Python between ops)", ms(d["unattributed_s"]),
         _share(d["unattributed_s"], step)],
        ["step, unprofiled (what a run without the profiler takes)", ms(d["unprofiled_step_s"]), ""],
        ["the profiler's own cost (profiled - unprofiled)", ms(d["profiler_overhead_s"]),
         _share(d["profiler_overhead_s"], d["unprofiled_step_s"]) + " of unprofiled"],
        *_production_rows(d),
        ["predicted: roofs + measured overhead", ms(d["predicted_step_s"]), ""],
        ["roofline only (every op at its roof)", ms(d["roofline_step_s"]), ""],
    ]
    t.notes.append(f"measured {d['tok_per_s']:,.1f} tok/s, predicted {d['predicted_tok_per_s']:,.1f} tok/s "
                   f"({d['tokens_per_step']} tokens per step; {d['steps_used']} of {d['steps_measured']} profiled "
                   f"steps averaged: those in the middle half by time)")
    if "production_step_s" in d:
        t.notes.append(f"production step (as anatomy.generate runs it): {d['tok_per_s']:,.1f} tok/s against "
                       f"{d['eager_tok_per_s']:,.1f} tok/s for the eager step profiled here; "
                       f"{d['production_captured_graphs']} captured graph(s), {d['production_native_blocks']} "
                       f"blocks fused, {d['production_context']} cache slots (the engine's cache rounds T up); "
                       "the prediction is the eager step's")
        t.notes.append("production ms of a position (of an op: --json) = its profiled ms x production step / "
                       "profiled step (its share of the eager step: a captured graph and fused blocks have no ranges)")
    if d["profiler_overhead_s"] < 0:
        t.notes.append("the profiled steps ran faster than the unprofiled ones: the machine's noise between the "
                       "rounds is larger than the profiler's cost, so neither is measured here")
    return t


def _production_rows(d: dict[str, Any]) -> list[list[str]]:
    """The production step's row of a phase's summary (none where it was not measured)."""
    if "production_step_s" not in d:
        return []
    return [["step, production (captured, as anatomy.generate runs it; unprofiled)", ms(d["production_step_s"]),
             _share(d["production_step_s"], d["unprofiled_step_s"]) + " of unprofiled"]]


def _positions(phase: str, d: dict[str, Any], report: dict[str, Any]) -> TableSpec:
    split = d.get("production_positions")
    t = TableSpec(f"{phase}: the positions of the decoder's map",
                  ["position", "ms per step", "share", *(["production ms (split)"] if split else []), "roofline ms",
                   "bound (by time)", "serves it"])
    labels = report["positions"]
    roof: dict[str, float] = {}
    bounds: dict[str, dict[str, float]] = {}
    for o in d["ops"]:
        roof[o["position"]] = roof.get(o["position"], 0.0) + (o["roofline_s"] or 0.0)
        b = bounds.setdefault(o["position"], {})
        b[o["bound"]] = b.get(o["bound"], 0.0) + o["time_s"]
    for key, seconds in d["positions"].items():
        if not seconds:
            continue
        mix = ", ".join(f"{k} {v / seconds:.0%}" for k, v in sorted(bounds.get(key, {}).items(), key=lambda kv: -kv[1]))
        t.rows.append([labels[key]["label"], ms(seconds), _share(seconds, d["step_s"]),
                       *([ms(split[key])] if split else []), ms(roof.get(key)), mix, labels[key]["serves"]])
    t.rows.append(["unattributed", ms(d["unattributed_s"]), _share(d["unattributed_s"], d["step_s"]),
                   *([ms(d["production_unattributed_s"])] if split else []), "", "", ""])
    return t


def _ops(phase: str, d: dict[str, Any]) -> TableSpec:
    t = TableSpec(f"{phase}: every op (summed over layers), per step",
                  ["position", "module", "op", "calls", "inputs -> output", "FLOPs", "bytes", "us", "FLOP/s", "B/s",
                   "roofline us", "bound", "ran as"])
    for o in d["ops"]:
        shapes = o["shapes"]
        shown = "" if shapes is None else " ".join(str(s) for s in shapes["inputs"]) + f" -> {shapes['output']}"
        t.rows.append([o["position"], o["module"], o["op"], f"{o['calls']:g}", shown,
                       "-" if o["flops"] is None else si(o["flops"]),
                       "-" if o["bytes"] is None else si(o["bytes"], "B"),
                       us(o["time_s"]), _rate(o["flops_per_s"], ""), _rate(o["bytes_per_s"], ""), us(o["roofline_s"]),
                       o["bound"], _ran_as(o)])
    t.notes.append("FLOPs and bytes: the shape trace's rows (anatomy inspect), a linear's weight at the real size of "
                   "the layout its planned kernel reads; (python): the module's own Python between its ops; ran as: "
                   "the planned kernel and the aten op that did most of the work")
    return t


def _ran_as(o: dict[str, Any]) -> str:
    via = o["via"] or ""
    return f"{o['kernel']}: {via}" if o.get("kernel") else via


def _miss(phase: str, d: dict[str, Any]) -> TableSpec:
    m = d["miss"]
    t = TableSpec(f"{phase}: what the prediction misses", ["module", "op", "us", "roofline us", "above the roof us"])
    t.rows = [[r["module"], r["op"], us(r["time_s"]), us(r["roofline_s"]), us(r["excess_s"])] for r in m["rows"]]
    t.notes.append(f"measured {ms(m['measured_s'])} ms (unprofiled) against predicted {ms(m['predicted_s'])} ms: "
                   f"{m['ratio']:.2f}x; the rows above carry the difference")
    return t


def sweep_keys(report: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["sweep"] for r in report.get("sweep", [])))


def _sweep(key: str, report: dict[str, Any]) -> TableSpec:
    t = TableSpec(f"Sweep over {key}: decode", ["batch", "context", "tok/s measured", "tok/s predicted",
                                                     "tok/s roofline", "GEMM ms", "GEMM bound", "attention ms",
                                                     "attention bytes", "KV writes ms"])
    for p in (r for r in report["sweep"] if r["sweep"] == key):
        t.rows.append([str(p["batch"]), str(p["context"]), f"{p['tok_per_s']:,.1f}",
                       f"{p['predicted_tok_per_s']:,.1f}",
                       "-" if p["roofline_tok_per_s"] is None else f"{p['roofline_tok_per_s']:,.1f}",
                       ms(p["gemm_s"]), p["gemm_bound"] or "-", ms(p["attention_s"]), si(p["attention_bytes"], "B"),
                       ms(p["kv_write_s"])])
    if key == "batch" and "ridge" in report:
        r = report["ridge"]
        measured = "not within the sweep" if r["measured_batch"] is None else f"{r['measured_batch']:.3g}"
        t.notes.append(f"decode stops being bandwidth-bound at batch {measured} measured (where the GEMM time's flat "
                       f"and rising lines meet), {r['predicted_batch']} predicted (the roofline on the measured roofs)")
    return t


def _what_if(w: dict[str, Any], report: dict[str, Any]) -> TableSpec:
    t = TableSpec(f"What if {w['switch']}: measured before -> after, ms per step",
                  ["phase", "position", "before", "after", "change"])
    labels = report["positions"]
    for phase, p in w["phases"].items():
        t.rows.append([phase, "step (unprofiled)", ms(p["before_step_s"]), ms(p["after_step_s"]),
                       _change(p["before_step_s"], p["after_step_s"])])
        for key, (before, after) in p["positions"].items():
            if before or after:
                t.rows.append([phase, labels[key]["label"], ms(before), ms(after), _change(before, after)])
        t.notes.append(f"{phase}: {p['before_tok_per_s']:,.1f} -> {p['after_tok_per_s']:,.1f} tok/s")
    return t


def _change(before: float, after: float) -> str:
    """The change of seconds `before` -> `after`, in ms and relative."""
    delta = f"{(after - before) * 1e3:+,.2f} ms"
    return f"{delta} ({(after - before) / before:+.0%})" if before else delta


def _hardware(h: dict[str, Any]) -> TableSpec:
    t = TableSpec(f"Predicted on {h['name']} (roofline)", ["phase", "step", "tok/s", "bound", "measured here, tok/s"])
    for phase in ("prefill", "decode"):
        if phase in h:
            p = h[phase]
            t.rows.append([phase, si(p["step_s"], "s"), f"{p['tok_per_s']:,.1f}", p["bound"],
                           f"{p['measured_here_tok_per_s']:,.1f}"])
    t.notes.append(f"peak {si(h['peak_flops_per_s'], 'FLOP/s')}, bandwidth {si(h['bandwidth_bytes_per_s'], 'B/s')}; "
                   f"{h['source']}")
    return t


def markdown(report: dict[str, Any]) -> str:
    m = report["model"]
    head = f"# anatomy profile of {m['name']} ({m['architecture']}, {count(m['parameters'])} parameters)\n\n"
    return head + markdown_tables(tables(report))


def print_rich(report: dict[str, Any], *, width: int | None = None) -> None:
    from rich.console import Console

    console = Console(width=width)
    m = report["model"]
    console.print(f"[bold]anatomy profile of {m['name']}[/bold] ({m['architecture']}, {m['parameters']:,} parameters)")
    print_tables(console, tables(report))
