"""The report as tables: one list of (title, columns, rows, notes), rendered by rich in the
terminal or as Markdown."""

from __future__ import annotations

from typing import Any

from anatomy.analysis.render_parallel import parallel_tables
from anatomy.analysis.tables import TableSpec, count, nbytes, si


def tables(report: dict[str, Any]) -> list[TableSpec]:
    out = [_params(report["params"]), _flops(report["flops"]), _memory(report["memory"]),
           _roofline(report["roofline"])]
    if "training" in report:
        out.append(_training(report["training"]))
    if "speculative" in report:
        out.append(_speculative(report["speculative"], report["roofline"]["hardware"]["name"]))
    if "parallel" in report:
        out += parallel_tables(report["parallel"])
    if "lora" in report:
        out.append(_lora(report["lora"], report["options"]))
    for phase in ("prefill", "decode"):
        rows = [r for r in report["trace"] if r["phase"] == phase]
        if rows:
            out.append(_trace(phase, rows, report["options"]))
    return out


def _params(p: dict[str, Any]) -> TableSpec:
    t = TableSpec("Parameter ledger", ["component", "formula", "per copy", "copies", "total"])
    t.rows = [[c["name"], c["formula"], count(c["per_copy"]), str(c["copies"]), count(c["total"])]
              for c in p["components"]]
    t.rows += [["per layer", "", "", "", count(p["per_layer"])]]
    if "per_decoder_layer" in p:
        t.rows += [["per decoder layer", "", "", "", count(p["per_decoder_layer"])]]
    t.rows += [["total (exact)", "", "", "", count(p["total"])]]
    if "active" in p:
        t.rows += [["active per token (k of E experts)", "", "", "", count(p["active"])]]
        t.notes.append(f"total {si(p['total'])} parameters, {si(p['active'])} active per token; the experts hold "
                       f"{si(p['experts'])}")
    t.rows += [
               ["12*L*D^2 estimate", "", "", "", count(p["approx_12ld2"])],
               ["difference", "exact - 12*L*D^2", "", "", count(p["difference"])]]
    t.rows += [[f"  of which {k}", "", "", "", count(v)] for k, v in p["difference_explained"].items() if v]
    return t


def _flops(f: dict[str, Any]) -> TableSpec:
    t = TableSpec("FLOPs (matmuls, 2 per multiply-add)", ["quantity", "FLOPs", ""])
    for k, v in f["parts"].items():
        t.rows.append([f"forward: {k.replace('_', ' ')}", count(v), si(v, "FLOP")])
    rows = [
        ("forward total (dense attention, LM head at every position)", f["forward"]),
        ("forward, causal halving of the attention matmuls", f["forward_causal_halved"]),
        ("forward without attention matmuls (projections + FFN + head only)", f["forward_without_attention_matmuls"]),
        ("one layer", f["per_layer_total"]),
        ("forward per token", f["forward_per_token"]),
        ("prefill for generation (LM head at the last position)", f["prefill_last_position_head"]),
        ("training per token: 3 x forward", f["training_per_token"]),
        ("training per token: 6N", f["training_per_token_6n"]),
        ("FlopCounterMode, same forward on meta", f["flop_counter_forward"]),
    ]
    if "decode_step" in f:
        rows.insert(6, ("decode step (B tokens at context T)", f["decode_step"]))
    t.rows += [[name, count(v), si(v, "FLOP")] for name, v in rows]
    t.notes.append("FlopCounterMode agrees with the analytic forward" if f["flop_counter_matches"] else
                   "FlopCounterMode differs from the analytic forward")
    masked = f["forward"] - f["forward_causal_halved"]
    if masked:
        t.notes.append(f"FlopCounterMode counts all S^2 query-key pairs (it ignores the causal mask); a kernel that "
                       f"skips the masked ones does {count(masked)} fewer FLOPs")
    return t


def _memory(m: dict[str, Any]) -> TableSpec:
    t = TableSpec("Memory", ["quantity", "bytes"])
    t.rows += [[f"weights in {d}", nbytes(v)] for d, v in m["weights_bytes_by_dtype"].items()]
    if "stored_weights" in m:
        stored = m["stored_weights"]
        t.rows += [[f"as stored ({stored['source']})", nbytes(stored["bytes"])]]
        t.rows += [[f"  {kind}", nbytes(v)] for kind, v in sorted(stored["by_format"].items(), key=lambda kv: -kv[1])]
    t.rows += [
        ["KV cache per token", nbytes(m["kv_cache_bytes_per_token"])],
        ["KV cache at (B, T)" + (", sliding windows capped" if "kv_cache_bytes_without_windows" in m else ""),
         nbytes(m["kv_cache_bytes"])],
        *([["KV cache at (B, T), every position kept", nbytes(m["kv_cache_bytes_without_windows"])]]
          if "kv_cache_bytes_without_windows" in m else []),
        ["naive attention scores [B, H, S, S], one layer", nbytes(m["naive_scores_bytes_per_layer"])],
        ["fused attention log-sum-exp [B, H, S], one layer", nbytes(m["fused_attention_bytes_per_layer"])],
    ]
    for kind, a in m["activations"].items():
        label = kind.replace("_", " ")
        t.rows += [[f"training activations, {label}", nbytes(a["total"])],
                   [f"  per block, {label}", nbytes(a["per_block"])],
                   [f"  with activation checkpointing, {label}", nbytes(a["checkpointed"])]]
    t.rows.append(["training state: weights + grads + Adam (16 B/param)", nbytes(m["training_state_bytes"])])
    if "experts" in m:
        e = m["experts"]
        t.rows += [["expert weights, all resident", nbytes(e["resident_bytes"])],
                   ["expert weights one token reads (k experts per layer)", nbytes(e["read_per_token_bytes"])],
                   [_touched(e["experts_touched_per_layer_decode_step"]), nbytes(e["read_per_decode_step_bytes"])]]
        t.notes.append("experts a step reads: E * (1 - (1 - k/E)^B) per layer for B tokens routed evenly")
    t.notes.append("activations: tensors saved for backward, measured on the meta device (loss included)")
    return t


def _touched(experts: float) -> str:
    return f"expert weights a decode step of B tokens reads (~{experts:.3g} experts per layer)"


def _roofline(r: dict[str, Any]) -> TableSpec:
    hw = r["hardware"]
    t = TableSpec(f"Roofline on {hw['name']}", ["phase", "FLOPs", "bytes", "FLOP/byte", "bound", "time",
                                                "per token", "tok/s"])
    for phase in ("prefill", "decode"):
        if phase in r:
            p = r[phase]
            t.rows.append([phase, si(p["flops"]), si(p["bytes"], "B"), f"{p['intensity']:.3g}", p["bound"],
                           si(p["time_s"], "s"), si(p["time_per_token_s"], "s"), f"{p['tokens_per_s']:,.1f}"])
    t.notes.append(f"peak {si(hw['peak_flops'], 'FLOP/s')} dense, bandwidth {si(hw['bandwidth'], 'B/s')}, "
                   f"ridge {hw['peak_flops'] / hw['bandwidth']:.3g} FLOP/byte; {hw['source']}")
    if "decode_compute_bound_batch" in r:
        b = r["decode_compute_bound_batch"]
        t.notes.append(f"decode turns compute-bound at batch {b}" if b else
                       "decode stays memory-bound at any batch at this context (KV cache reads dominate)")
    return t


def _training(tr: dict[str, Any]) -> TableSpec:
    t = TableSpec("Training time", ["quantity", "value"])
    t.rows = [
        ["tokens", f"{tr['tokens']:.3g}"],
        ["total FLOPs (6 N tokens)", f"{tr['total_flops']:.3g}"],
        ["effective FLOP/s per GPU (peak x MFU)", f"{tr['peak_flops'] * tr['mfu']:.4g}"],
        ["GPU-seconds", f"{tr['gpu_seconds']:.3g}"],
        ["GPU-hours", f"{tr['gpu_hours']:,.0f}"],
        ["GPU-days", f"{tr['gpu_days']:,.0f}"],
        [f"days on {tr['gpus']} GPUs", f"{tr['wall_days']:.3g}"],
        ["total FLOPs with attention (3 x forward)", f"{tr['total_flops_with_attention']:.3g}"],
        [f"days on {tr['gpus']} GPUs with attention", f"{tr['wall_days_with_attention']:.3g}"],
    ]
    return t


def _lora(lo: dict[str, Any], o: dict[str, Any]) -> TableSpec:
    t = TableSpec(f"LoRA adapter: rank {lo['rank']} on {', '.join(lo['targets'])} of {lo['layers']} layers",
                  ["quantity", "value", ""])
    t.rows = [[f"parameters: {k}", count(v), ""] for k, v in lo["params_by_target"].items()]
    t.rows += [
        ["parameters (trainable)", count(lo["params"]), f"{100 * lo['fraction_of_model']:.3g}% of the model"],
        ["adapter file (f32)", nbytes(lo["bytes_f32"]), ""],
        ["FLOPs per token added (forward)", count(lo["flops_per_token"]), si(lo["flops_per_token"], "FLOP")],
        ["training state, full fine-tune", nbytes(lo["training_state_full_bytes"]), ""],
        [f"training state, LoRA (base frozen in {o['dtype']})", nbytes(lo["training_state_lora_bytes"]), ""],
        ["saving", nbytes(lo["training_state_saving_bytes"]), f"{lo['training_state_ratio']:.3g}x less"],
    ]
    t.notes.append("training state: weights, gradients and AdamW moments (16 B per trained parameter); the "
                   "activations, about the same either way, are not counted")
    return t


def _speculative(s: dict[str, Any], hardware: str) -> TableSpec:
    t = TableSpec(f"Speculative decoding on {hardware}: k = {s['k']}, acceptance a = {s['acceptance']:g}, "
                  f"draft {s['draft']}", ["quantity", "value"])
    draft = s["draft_step"]
    t.rows = [
        ["tokens per target forward E = (1 - a^(k+1)) / (1 - a)", f"{s['expected_tokens_per_forward']:.3g}"],
        ["acceptance rate (kept / proposed, as --stats counts it)", f"{s['expected_acceptance_rate']:.1%}"],
        ["plain decode step", f"{si(s['step']['time_s'], 's')} ({s['step']['bound']}-bound, "
                              f"{si(s['step']['bytes'], 'B')})"],
        [f"verification: one forward over k + 1 = {s['k'] + 1} rows", f"{si(s['verify']['time_s'], 's')} "
         f"({s['verify']['bound']}-bound, {si(s['verify']['flops'], 'FLOP')}, {si(s['verify']['bytes'], 'B')})"],
        *([[f"draft step ({s['draft_dtype']} weights) x k", f"{si(draft['time_s'], 's')} ({draft['bound']}-bound, "
                                                               f"{si(draft['bytes'], 'B')})"]] if draft else []),
        ["target weight bytes per token: plain -> speculative",
         f"{si(s['plain_weight_bytes_per_token'], 'B')} -> {si(s['target_weight_bytes_per_token'], 'B')}"],
        ["decode tok/s: plain -> speculative", f"{s['plain_tokens_per_s']:,.1f} -> {s['tokens_per_s']:,.1f}"],
        ["predicted speedup", f"{s['speedup']:.2f}x"],
        [f"best k at a = {s['acceptance']:g}", f"{s['best_k']} ({s['best_speedup']:.2f}x)"],
        [f"break-even acceptance at k = {s['k']}",
         f"{s['break_even_acceptance']:.2f}" if s["break_even_acceptance"] is not None else "never pays"],
    ]
    t.notes.append(f"at context T = {s['context']}; compare with `anatomy generate --speculative ... --stats` "
                   "(tokens per target forward, per-token a)")
    return t


def _trace(phase: str, rows: list[dict[str, Any]], o: dict[str, Any]) -> TableSpec:
    shape = f"[B={o['batch']}, S={o['seq']}]" if phase == "prefill" else f"[B={o['batch']}, 1] at T={o['context']}"
    t = TableSpec(f"Shape trace: {phase} {shape}", ["module", "op", "inputs", "output", "FLOPs", "bytes", "note"])
    t.rows = [[r["module"], r["op"], " ".join(str(s) for s in r["inputs"]), str(r["output"]), count(r["flops"]),
               count(r["bytes"]), r["note"]] for r in rows]
    return t


def markdown(report: dict[str, Any]) -> str:
    parts = [f"# anatomy of {report['model']['name']}", "", "```", report["diagram"]["text"], "```", ""]
    return "\n".join(parts) + "\n" + markdown_tables(tables(report))


def markdown_tables(specs: list[TableSpec]) -> str:
    """Each table as a Markdown section: its title, the table, its notes as a list."""
    parts: list[str] = []
    for t in specs:
        parts += [f"## {t.title}", "", "| " + " | ".join(t.columns) + " |", "|" + "---|" * len(t.columns)]
        parts += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in t.rows]
        parts += [""] + [f"- {n}" for n in t.notes] + ([""] if t.notes else [])
    return "\n".join(parts)


def print_rich(report: dict[str, Any], *, width: int | None = None) -> None:
    from rich.console import Console

    console = Console(width=width)
    console.print(f"[bold]anatomy of {report['model']['name']}[/bold]")
    console.print(report["diagram"]["text"], markup=False)
    print_tables(console, tables(report))


def print_tables(console: Any, specs: list[TableSpec]) -> None:
    """Each table through rich, its notes under it."""
    from rich.table import Table

    for spec in specs:
        table = Table(title=spec.title, title_justify="left")
        for column in spec.columns:
            table.add_column(column, overflow="fold")
        for row in spec.rows:
            table.add_row(*row)
        console.print(table)
        for note in spec.notes:
            console.print(f"  {note}", markup=False)
