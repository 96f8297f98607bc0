"""Every candidate kernel on SmolLM2-135M's real weight shapes, and what a decode step's linears cost.

Weights: layer 0 of the embedded Q4_1 GGUF (q|k|v fused [960, 576], o [576, 576], gate|up fused
[3072, 576], down [576, 1536]) and the tied Q8_0 embedding as the LM head [49152, 576], each in
the file's own format (int4 / int8g, no requantization) with every candidate the kernel layer
offers for it (dense copies included), plus int8 per-channel (requantized) for _weight_int8pack_mm
and, for the LM head, int4 requantized from the Q8_0 values (lossy: its quality is
bench_kernel_quality's question). Timings come from the plan's own measurement (plan_timing:
interleaved rounds, median, cache-exceeding pools of copies at 1 and 8 rows), so the numbers are
those a plan decides on. Memory bandwidth (torch sum over 256 MiB on 2 MiB pages) is measured in the same run.

    rows 1, 8:     G weights/s, GB/s of the layout read, % of the measured bandwidth
    rows 128, 512: GFLOP/s (2 * rows * N * K per call)

Then the decode step (batch 1 and 8): 30 x (qkv + o + gate_up + down) + LM head, per choice,
estimated from those per-shape times; and measured: all 121 layers of the model as PlannedLinear
(the plan's choices, made in this run) called in model order on one token's rows, eager, with
float32 and with bfloat16 activations in and out (the casts a float32 model pays included).

    python -m benchmarks kernels        (ANATOMY_BENCH_REPEATS=5)
"""

from __future__ import annotations

import functools
import os

import torch

from anatomy.checkpoints.gguf_reader import read_gguf
from anatomy.checkpoints.registry import resolve
from anatomy.weights.formats import Int4Weight, Int8Weight, WeightFormat
from anatomy.weights.gguf import matrix_formats, named
from anatomy.kernels.candidates import KERNELS, KERNELS_BY_NAME
from anatomy.kernels.plan import make_plan
from anatomy.kernels.timing import Measurement, Phase, measure_weight
from anatomy.kernels.planned_linear import PlannedLinear
from benchmarks.timing import bandwidth_gbs, median_seconds

MODEL = "smollm2-135m-instruct"
REPEATS = int(os.environ.get("ANATOMY_BENCH_REPEATS", "5"))
ROWS = (1, 8, 128, 512)
LAYERS = 30
BLOCK = {"qkv": "blocks.0.attn.qkv.weight", "o": "blocks.0.attn.out.weight",
         "gate_up": "blocks.0.ffn.gate_up.weight", "down": "blocks.0.ffn.down.weight"}  # name suffixes
HEAD = "embed.tokens.weight"


def weights() -> dict[str, list[WeightFormat]]:
    """{shape name: [the file's format, int8 per-channel, (LM head) int4 requantized]}."""
    formats = matrix_formats(read_gguf(resolve(MODEL)))
    out = {}
    for short, suffix in [*BLOCK.items(), ("head", HEAD)]:
        fmt = formats[named(formats, suffix)]
        w = fmt.dequantize()
        out[short] = [fmt, Int8Weight.from_float(w, label=f"{short} int8")]
        if short == "head":
            out[short].append(Int4Weight.from_float(w, label="head int4 (requantized)"))
    return out


def measure(fmt: WeightFormat, rows: tuple[int, ...]) -> dict[str, dict[int, Measurement]]:
    """{kernel: {rows: Measurement}} for every candidate of fmt (int8: only its own kernel)."""
    phases = tuple(Phase(str(r), r, None) for r in rows)
    kernels = (KERNELS_BY_NAME["int8pack"],) if fmt.name == "int8" else \
        (KERNELS_BY_NAME["int4pack"],) if "requantized" in fmt.label else KERNELS
    ms = measure_weight(fmt, phases=phases, kernels=kernels, threshold=1e-2, repeats=REPEATS)
    out: dict[str, dict[int, Measurement]] = {}
    for r in rows:
        for m in ms[str(r)]:
            out.setdefault(_label(fmt, m.kernel), {})[r] = m
    return out


def _label(fmt: WeightFormat, kernel: str) -> str:
    if fmt.name == "int8":
        return "int8pack (int8 per-channel, requantized)"
    if "requantized" in fmt.label:
        return "int4pack (int4 g32, requantized)"
    return kernel


def table(short: str, fmt: WeightFormat, results: dict[str, dict[int, Measurement]], bw: float) -> list[str]:
    N, K = fmt.shape
    lines = [f"\n### {short} [{N}, {K}] ({fmt.signature} from the file)\n",
             "| kernel | layout MiB | 1 row: Gw/s | GB/s | % BW | 8 rows: Gw/s | 128: GFLOP/s | 512: GFLOP/s | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, by_rows in sorted(results.items(), key=lambda kv: _seconds(kv[1].get(1))):
        nbytes = _layout_bytes(name, fmt)
        m1 = by_rows.get(1)
        cells = [name, f"{nbytes / 2 ** 20:.1f}"]
        if m1 is not None and m1.seconds:
            cells += [f"{N * K / m1.seconds / 1e9:.1f}{_mark(m1)}", f"{nbytes / m1.seconds / 1e9:.1f}",
                      f"{nbytes / m1.seconds / 1e9 / bw:.0%}"]
        else:
            cells += [_why(m1), "", ""]
        for r in (8, 128, 512):
            m = by_rows.get(r)
            if m is None or not m.seconds:
                cells.append(_why(m))
            elif r == 8:
                cells.append(f"{N * K / m.seconds / 1e9:.1f}{_mark(m)}")
            else:
                cells.append(f"{2 * r * N * K / m.seconds / 1e9:.0f}{_mark(m)}")
        errors = [m.error for m in by_rows.values() if m.error is not None]
        cells.append(f"{max(errors):.1e}" if errors else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _layout_bytes(label: str, fmt: WeightFormat) -> int:
    N, K = fmt.shape
    if label.startswith("int8pack"):
        return N * K + N * 2
    if label.startswith("int4pack (int4"):
        return N * K // 2 + N * K // 32 * 4
    return KERNELS_BY_NAME[label].form.nbytes(fmt)


def _seconds(m: Measurement | None) -> float:
    return m.seconds if m is not None and m.seconds else float("inf")


def _mark(m: Measurement) -> str:
    return "*" if m.note.startswith("pruned") else ""


def _why(m: Measurement | None) -> str:
    if m is None:
        return "-"
    return m.note.split(":")[0] or "-"


def step_estimates(results: dict[str, dict[str, dict[int, Measurement]]]) -> list[str]:
    """Decode-step linear time at 1 and 8 rows: blocks with each kernel x LM head with each kernel."""
    lines = ["\n### a decode step's linears: 30 x (qkv + o + gate_up + down) + LM head, ms\n",
             ("| blocks kernel | blocks, 1 row | blocks, 8 rows | LM head kernel | head, 1 row | head, 8 rows |"
              " step, batch 1 | step, batch 8 (per token) |"), "|---|---|---|---|---|---|---|---|"]
    block_kernels = set.intersection(*(set(results[s]) for s in BLOCK))
    blocks = {k: [LAYERS * sum(_seconds(results[s][k].get(r)) for s in BLOCK) for r in (1, 8)] for k in block_kernels}
    heads = {k: [_seconds(v.get(r)) for r in (1, 8)] for k, v in results["head"].items()}
    best_blocks = sorted(blocks.items(), key=lambda kv: kv[1][0])[:4]
    best_heads = sorted(heads.items(), key=lambda kv: kv[1][0])[:5]
    for bk, (b1, b8) in best_blocks:
        for hk, (h1, h8) in best_heads:
            lines.append(f"| {bk} | {b1 * 1e3:.2f} | {b8 * 1e3:.2f} | {hk} | {h1 * 1e3:.2f} | {h8 * 1e3:.2f} | "
                         f"{(b1 + h1) * 1e3:.2f} | {(b8 + h8) * 1e3:.2f} ({(b8 + h8) * 1e3 / 8:.2f}) |")
    return lines


def rows_scaling(fmt: WeightFormat) -> list[str]:
    """ms per call of the few-row contenders on one weight as the number of rows grows."""
    rows = (1, 2, 4, 5, 8, 12, 16, 32)
    names = ("int4pack", "bf16/onednn", "f16/fbgemm", "f16")
    ms = measure_weight(fmt, phases=tuple(Phase(str(r), r, None) for r in rows),
                        kernels=tuple(KERNELS_BY_NAME[n] for n in names), threshold=1e-2, repeats=REPEATS)
    lines = [f"\n### {fmt.signature}: ms per call by rows\n", "| rows | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    for r in rows:
        by = {m.kernel: m for m in ms[str(r)]}
        lines.append(f"| {r} | " + " | ".join(f"{by[n].seconds * 1e3:.3f}{_mark(by[n])}" if n in by and by[n].seconds
                                            else "-" for n in names) + " |")
    return lines


def planned_step(bw: float) -> list[str]:
    """All linear layers as PlannedLinear from a fresh plan, called in model order: ms per step."""
    formats = matrix_formats(read_gguf(resolve(MODEL)))
    head = named(formats, HEAD)
    plan = make_plan(formats, model_id=MODEL, weights="gguf", phases_of={head: ["decode", "batch"]}, cache=False)
    lines = ["\n### the plan made in this run\n", *plan.describe(),
             "\n### a decode step's linears measured: 121 PlannedLinear layers in model order, eager, ms\n",
             "| activations | batch 1 | batch 8 | batch 8 per token |", "|---|---|---|---|"]
    for dtype in (torch.float32, torch.bfloat16):
        layers = [(PlannedLinear.from_plan(plan, name, fmt, dtype=dtype), fmt.shape[1]) for name, fmt in formats.items()]
        step = {}
        for rows in (1, 8):
            xs = {K: torch.randn(rows, 1, K, dtype=dtype) for _, K in layers}
            with torch.inference_mode():
                step[rows] = median_seconds(functools.partial(_call_all, layers, xs), REPEATS + 2, warmup=True)
        lines.append(f"| {dtype} | {step[1] * 1e3:.2f} | {step[8] * 1e3:.2f} | {step[8] * 1e3 / 8:.2f} |")
    read = sum(plan.for_layer(n).form_bytes[plan.for_layer(n).forms[0]] for n in formats)
    lines.append(f"\ndecode layouts read per token: {read / 1e6:.1f} MB ({read / bw / 1e6:.2f} ms at the measured "
                 f"{bw:.1f} GB/s)")
    return lines


def _call_all(layers: list[tuple[PlannedLinear, int]], xs: dict[int, torch.Tensor]) -> None:
    for layer, K in layers:
        layer(xs[K])


def main() -> None:
    torch.manual_seed(0)
    bw = bandwidth_gbs()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, capability "
          f"{torch.backends.cpu.get_cpu_capability()}; memory bandwidth (sum over 256 MiB on 2 MiB "
          f"pages) {bw:.1f} GB/s; "
          f"repeats {REPEATS}; * = pruned after the first pass (over 6x the fastest)")
    results: dict[str, dict[str, dict[int, Measurement]]] = {}
    all_weights = weights()
    formats_gate_up = all_weights["gate_up"][0]
    for short, fmts in all_weights.items():
        results[short] = {}
        for fmt in fmts:
            results[short].update(measure(fmt, ROWS if short != "head" else (1, 8, 128)))
        print("\n".join(table(short, fmts[0], results[short], bw)), flush=True)
    print("\n".join(step_estimates(results)))
    print("\n".join(rows_scaling(formats_gate_up)))
    print("\n".join(planned_step(bw)))


if __name__ == "__main__":
    main()
