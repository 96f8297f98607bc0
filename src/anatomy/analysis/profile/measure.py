"""`anatomy profile`: the run in front of you, taken apart by the positions of the decoder's map.

    report = profile(model, options=ProfileOptions(batch=1, prompt_len=128, new_tokens=16))
    report["phases"]["decode"]["positions"]     # seconds per step at each position of seed 003's map

Each phase's real steps run without and with torch.profiler (run.py); each timed op is matched to
its row of the shape trace (match.py), which gives its FLOPs and bytes, and gets its roofline time
and verdict against this machine's roofs measured in the same run (rows.py). The step's time is
reconciled exactly with its rows plus `unattributed_s`, and predicted; a decoder's decode step is
also timed as anatomy.generate runs it, split over the rows by their shares (docs/profile.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from anatomy import dtypes
from anatomy.kv_format import kv_bytes_per_token
from anatomy.analysis import trace as shape_trace
from anatomy.analysis.hardware import INTEGER_ROOFS, Hardware
from anatomy.analysis.params import parameter_ledger
from anatomy.analysis.profile.calls import take_apart
from anatomy.analysis.profile.checks import check_shape
from anatomy.analysis.profile.machine import Machine, cpu_sample, load_note, machine_dict
from anatomy.analysis.profile.match import TraceIndex, layer_kinds
from anatomy.analysis.profile.positions import POSITIONS, module_positions
from anatomy.analysis.profile.rows import Roofs, Row, build_rows, middle_steps, row_dict
from anatomy.analysis.profile.run import NamedRanges, run_phase
from anatomy.analysis.profile.weights import WeightTable
from anatomy.analysis.profile.workloads import Shape, workload
from anatomy.config import ModelConfig
from anatomy.inference.engine.engine import RUN_BLOCK

MISS_ROWS = 5


@dataclass(frozen=True)
class ProfileOptions:
    batch: int = 1
    prompt_len: int = 128
    context: int | None = None  # default: prompt_len + warmup + new_tokens + 1
    new_tokens: int = 16  # measured decode steps (and prefills: prefill_runs)
    warmup: int = 2
    prefill_runs: int = 6
    rounds: int = 2  # alternations of unprofiled and profiled runs
    phases: tuple[str, ...] = ("prefill", "decode")  # those the model has are run
    attention: str | None = None  # the attention backend of the engine's view ("sdpa", "eager"); None: as built
    kv_dtype: str | None = None  # what the engine's KV cache holds (kv_format.py); None: the branches' dtype
    production: bool = True  # a decoder's decode step also timed as anatomy.generate runs it (the main run only)

    def context_for(self, config: ModelConfig) -> int:
        """T: the slots a decode step reads (an encoder's: S); by default the steps' own, rounded up to
        whole blocks of a run's cache, which a decoder's run reads whole."""
        if self.context is not None:
            return self.context
        if config.is_encoder:
            return self.prompt_len
        context = self.prompt_len + self.warmup + self.new_tokens + 1
        if not config.is_decoder:
            return context
        return min(-(-context // RUN_BLOCK) * RUN_BLOCK, max(context, config.max_seq_len))  # too long: checks.py says


def measure(model: nn.Module, *, options: ProfileOptions = ProfileOptions(), name: str = "",
            machine: Machine | Hardware | None = None, hardware: Hardware | None = None, engine=None,
            config: ModelConfig | None = None) -> dict[str, Any]:
    """Profile `model` (the caller's model is left as it was: the steps run on a view of it).
    `machine`: this machine's roofs (measured now when None); `hardware`: a named accelerator whose
    prediction is added next to the measurement. A parallel run's rank 0 gives its `engine` (the
    ParallelEngine over `model`, its shard) and the `config` of the shard's shapes for the trace."""
    config = config or model.config
    shape = Shape(options.batch, options.prompt_len, options.context_for(config))
    check_shape(config, shape, options)  # the caller checks memory (check_run) before loading
    work = workload(model, shape, attention=options.attention, kv_dtype=options.kv_dtype, engine=engine,
                    production=options.production)
    compute = dtypes.name_of(work.dtype)
    measured = machine if isinstance(machine, Machine) else Machine(machine)
    machine = measured.roofs(compute)
    if _integer_products(work.plan):
        machine = measured.integer_roofs()
    positions = module_positions(work.model)
    weights = WeightTable(model, work.plan)
    integer = {k: v for k, v in machine.peak_flops.items() if k in INTEGER_ROOFS}
    roofs = Roofs(machine.peak(compute), machine.bandwidth, measured.op_latency_s, integer=integer)
    ranges = NamedRanges(work.model)
    load = cpu_sample()
    phases = {}
    for phase, make_steps in work.phases.items():
        if phase not in options.phases:
            continue
        index = _trace_index(config, phase, shape, compute, work.model, backend=_backend(work.model))
        count = options.new_tokens if phase == "decode" else options.prefill_runs
        warmup = options.warmup + (1 if phase == "decode" else 0)  # a decode iterator's first step is its prefill
        production = work.production if phase == "decode" else None
        timed = run_phase(make_steps, ranges, phase=phase, warmup=warmup, count=count, rounds=options.rounds,
                          production=production)
        phases[phase] = _phase(timed, index, positions, weights, roofs, tokens=work.tokens[phase],
                               element_size=dtypes.parse(compute).torch.itemsize)
        if production is not None:
            phases[phase].update(_production(phases[phase], _middle_mean(timed.production_s), production))
        if phase == "decode" and work.kv_dtype is not None:  # the cache a step reads, scales included
            phases[phase]["kv_bytes_per_step"] = shape.batch * shape.context * kv_bytes_per_token(config, work.kv_dtype)
    report = {
        "model": {"name": name, "architecture": config.architecture, "parameters": parameter_ledger(config).total},
        "options": {"batch": shape.batch, "prompt_len": shape.prompt_len, "context": shape.context,
                    "new_tokens": options.new_tokens, "prefill_runs": options.prefill_runs,
                    "compute_dtype": compute, "kv_dtype": work.kv_dtype, "threads": torch.get_num_threads()},
        "machine": {**machine_dict(machine, compute), "op_latency_s": roofs.op_latency_s, "load": load_note(load)},
        "positions": {k: {"label": label, "serves": serves} for k, (label, serves) in POSITIONS.items()},
        "phases": phases,
    }
    if hardware is not None:
        report["hardware"] = named_prediction(config, hardware, shape, compute, phases,
                                              weight_dtype=_weight_dtype(model, compute))
    return report


def _integer_products(plan) -> bool:
    """Does the kernel plan run any product on integer activations (their own roof: hardware.py)?"""
    from anatomy.kernels.candidates import KERNELS_BY_NAME

    return plan is not None and any(KERNELS_BY_NAME[k].products for w in plan.weights.values()
                                    for k in w.choices.values() if k in KERNELS_BY_NAME)


def _backend(model: nn.Module) -> str:
    from anatomy.layers.attention import Attention

    return next((m.backend for m in model.modules() if isinstance(m, Attention)), "sdpa")


def _trace_index(config: ModelConfig, phase: str, shape: Shape, compute: str, model: nn.Module, *,
                 backend: str) -> TraceIndex:
    """The trace rows of each kind of layer, for the phase's shapes (a seq2seq prefill encodes one source)."""
    from anatomy.models import MaskedLM

    first_of_kind, kind_of_layer = layer_kinds(config)
    batch = 1 if config.is_seq2seq and phase == "prefill" else shape.batch
    head = "mlm" if isinstance(model, MaskedLM) else "auto"
    rows = {kind: shape_trace.trace(config, phase=phase, batch=batch, seq=shape.prompt_len, context=shape.context,
                                    dtype=compute, head=head, attention=backend, layer=layer)
            for kind, layer in first_of_kind.items()}
    return TraceIndex(rows, kind_of_layer)


def _phase(timed, index: TraceIndex, positions: dict[str, str], weights, roofs: Roofs, *, tokens: int,
           element_size: int) -> dict[str, Any]:
    steps = middle_steps([take_apart(e) for e in timed.events])
    rows = build_rows(steps, index, positions, weights, element_size=element_size)
    ops = [row_dict(r, roofs) for r in rows]
    step_s = statistics.fmean(s.seconds for s in steps)
    unattributed = statistics.fmean(s.unattributed_s for s in steps)
    ops_s = sum(r.time_s for r in rows)
    plain = _middle_mean(timed.plain_s)
    overhead = step_s - plain
    predicted = _predicted_s(ops, plain)
    return {
        "step_s": step_s, "ops_s": ops_s, "unattributed_s": unattributed,
        "unprofiled_step_s": plain, "profiler_overhead_s": overhead,
        "profiler_events_per_step": statistics.fmean(s.events for s in steps),
        "tokens_per_step": tokens, "tok_per_s": tokens / plain, "eager_tok_per_s": tokens / plain,
        "predicted_step_s": predicted, "predicted_tok_per_s": tokens / predicted,
        "roofline_step_s": sum(o["roofline_s"] or 0.0 for o in ops),
        "positions": _positions(rows),
        "bounds": _by(ops, "bound"),
        "steps_measured": len(timed.events), "steps_used": len(steps),
        "miss": _miss(ops, predicted, plain),
        "ops": ops,
    }


def _production(d: dict[str, Any], seconds: float, production) -> dict[str, Any]:
    """The production step beside the profiled one, and its split: each row (and the unattributed
    time) keeps its share of the profiled eager step, so the rows' production times add up to it."""
    scale = seconds / d["step_s"]
    for o in d["ops"]:
        o["production_time_s"] = o["time_s"] * scale
    return {"tok_per_s": d["tokens_per_step"] / seconds, "production_step_s": seconds,
            "production_context": production.context,
            "production_captured_graphs": production.engine.captured_graphs,
            "production_native_blocks": production.engine.native_blocks,
            "production_positions": {k: v * scale for k, v in d["positions"].items()},
            "production_unattributed_s": d["unattributed_s"] * scale}


def _middle_mean(values: list[float]) -> float:
    ranked = sorted(values)
    q = len(ranked) // 4 if len(ranked) >= 4 else 0
    return statistics.fmean(ranked[q:len(ranked) - q])


def _predicted_s(ops: list[dict], plain: float) -> float:
    """The rows a roof bounds at their roofline time, everything else as measured: the unprofiled
    step less the bound rows' measured time (so the profiler's own cost, which lands on the many
    small ops and the Python between them, is not predicted either)."""
    bound = [o for o in ops if o["roofline_s"] is not None and o["bound"] != "overhead"]
    roofed = sum(o["roofline_s"] for o in bound)
    return roofed + max(0.0, plain - sum(o["time_s"] for o in bound))


def _positions(rows: list[Row]) -> dict[str, float]:
    out = {k: 0.0 for k in POSITIONS}
    for row in rows:
        out[row.position] = out.get(row.position, 0.0) + row.time_s
    return out


def _by(ops: list[dict], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for o in ops:
        out[o[key]] = out.get(o[key], 0.0) + o["time_s"]
    return out


def _miss(ops: list[dict], predicted: float, measured: float) -> dict[str, Any]:
    """Measured against predicted, and the rows a roof bounds whose time is furthest above it."""
    excess = sorted((o for o in ops if o["roofline_s"] is not None and o["bound"] != "overhead"),
                    key=lambda o: o["roofline_s"] - o["time_s"])
    return {"measured_s": measured, "predicted_s": predicted, "ratio": measured / predicted,
            "rows": [{"module": o["module"], "op": o["op"], "time_s": o["time_s"], "roofline_s": o["roofline_s"],
                      "excess_s": o["time_s"] - o["roofline_s"]} for o in excess[:MISS_ROWS]]}


def _weight_dtype(model: nn.Module, compute: str) -> str:
    """The dtype most of the model's matrix bytes are held in (int8g counts as int8), for inspect's
    roofline, which sizes every weight alike."""
    from anatomy.weights.modules import compact_modules

    held: dict[str, int] = {}
    for module in {id(m.compact): m for m in compact_modules(model).values()}.values():
        name = "int8" if module.compact.name.startswith("int8") else module.compact.name
        held[name] = held.get(name, 0) + module.compact.nbytes
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.is_floating_point():
            name = dtypes.name_of(module.weight.dtype)
            held[name] = held.get(name, 0) + module.weight.nbytes
    return max(held, key=held.get) if held else compute


def named_prediction(config: ModelConfig, hardware: Hardware, shape: Shape, compute: str,
                     phases: dict[str, Any], *, weight_dtype: str | None = None) -> dict[str, Any]:
    """The same steps on a named accelerator: inspect's roofline points (analysis/roofline.py), the
    weights at `weight_dtype` (default: the compute dtype)."""
    from anatomy.analysis import roofline
    ledger = parameter_ledger(config)
    common = {"weight_dtype": weight_dtype or compute, "kv_dtype": compute, "compute_dtype": compute}
    out = {"name": hardware.name, "weight_dtype": common["weight_dtype"], "peak_flops_per_s": hardware.peak(compute),
           "bandwidth_bytes_per_s": hardware.bandwidth, "source": hardware.source}
    points = {"prefill": roofline.prefill_point(config, ledger, hardware, batch=shape.batch, seq=shape.prompt_len,
                                                **common)}
    if "decode" in phases:
        points["decode"] = roofline.decode_point(config, ledger, hardware, batch=shape.batch, context=shape.context,
                                                 source_len=shape.prompt_len, **common)
    for phase, p in points.items():
        out[phase] = {"step_s": p.time_s, "tok_per_s": p.tokens_per_s, "bound": p.bound,
                      "measured_here_tok_per_s": phases[phase]["tok_per_s"]}
    return out
