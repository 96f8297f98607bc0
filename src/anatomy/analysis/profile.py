"""`anatomy profile`: the run in front of you, taken apart by the positions of the decoder's map.

    report = profile(model, options=ProfileOptions(batch=1, prompt_len=128, new_tokens=16))
    report["phases"]["decode"]["positions"]     # seconds per step at each position of seed 003's map
    report["phases"]["decode"]["ops"]           # per op: shapes, FLOPs, bytes, time, roofline, verdict

For each phase (prefill, decode) the real steps run twice over, without and with torch.profiler
(analysis/profile_run.py); every timed op is put under its module and matched to its row of the
shape trace `anatomy inspect` prints (profile_match.py); FLOPs and bytes come from those rows, the
roofs from this machine measured in the same run (analysis/hardware.measure_local), and each op
gets its roofline time and verdict (profile_rows.py).

Reconciliation: a profiled step's time = the ops' rows (the modules' Python between their ops
included, as rows of their own) + `unattributed_s` (the step's time outside every module and
op: the engine's Python between them). The profiler's own cost is the profiled step against the
same step unprofiled; tok/s is measured unprofiled.

The prediction: every row a roof bounds at its roofline time; the rest of the step (the `overhead`
rows, which no roof predicts: dispatch, Python, small-op latency; and the unattributed time) as
measured, unprofiled. So the prediction misses by exactly the time the bound rows spend above their
roofs, and `miss` lists the rows that carry most of it.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from anatomy import dtypes
from anatomy.analysis import trace as shape_trace
from anatomy.analysis.hardware import Hardware, measure_local, measure_matmul_peak
from anatomy.analysis.profile_calls import take_apart
from anatomy.analysis.profile_match import TraceIndex, layer_kinds
from anatomy.analysis.profile_positions import POSITIONS, module_positions
from anatomy.analysis.profile_rows import Roofs, Row, build_rows, middle_steps, row_dict
from anatomy.analysis.profile_weights import WeightTable
from anatomy.analysis.profile_run import NamedRanges, run_phase
from anatomy.analysis.profile_workloads import Shape, workload
from anatomy.config import ModelConfig
from anatomy.errors import InputError

MISS_ROWS = 5
BUSY_SHARE = 0.1  # other processes' share of the machine's CPU time above which the report warns


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

    def context_for(self, config: ModelConfig) -> int:
        if self.context is not None:
            return self.context
        if config.is_encoder:
            return self.prompt_len
        return self.prompt_len + self.warmup + self.new_tokens + 1


class Machine:
    """This machine's roofs, measured once: the read bandwidth, and the matmul peak of each compute
    dtype the first time a run computes in it (a what-if in bf16 adds the bf16 peak). Given a
    Hardware (a test's fixed roofs), it measures nothing."""

    def __init__(self, hardware: Hardware | None = None, *, op_latency_s: float | None = None) -> None:
        self.hardware = hardware
        self._latency = op_latency_s

    @property
    def op_latency_s(self) -> float:
        """The time one small op takes here (measured once): the floor under every op's time."""
        if self._latency is None:
            self._latency = measure_op_latency()
        return self._latency

    def roofs(self, dtype: str) -> Hardware:
        hw = self.hardware
        if hw is None:
            self.hardware = measure_local(compute_dtypes=(dtype,))
        elif dtype not in hw.peak_flops and hw.name == "local":
            peak = measure_matmul_peak(torch.device("cpu"), dtype=dtypes.torch_dtype(dtype))
            self.hardware = dataclasses.replace(hw, peak_flops={**hw.peak_flops, dtype: peak},
                                                source=hw.source.replace(" matmul", f"/{dtype} matmul", 1), notes="")
        return self.hardware


def profile(model: nn.Module, *, options: ProfileOptions = ProfileOptions(), name: str = "",
            machine: Machine | Hardware | None = None, hardware: Hardware | None = None) -> dict[str, Any]:
    """Profile `model` (the caller's model is left as it was: the steps run on a view of it).
    `machine`: this machine's roofs (measured now when None); `hardware`: a named accelerator whose
    prediction is added next to the measurement."""
    config = model.config
    shape = Shape(options.batch, options.prompt_len, options.context_for(config))
    check_shape(config, shape, options)  # the caller checks memory (check_run) before loading
    work = workload(model, shape, attention=options.attention)
    compute = dtypes.name_of(work.dtype)
    measured = machine if isinstance(machine, Machine) else Machine(machine)
    machine = measured.roofs(compute)
    positions = module_positions(work.model)
    weights = WeightTable(model, work.plan)
    roofs = Roofs(machine.peak(compute), machine.bandwidth, measured.op_latency_s)
    ranges = NamedRanges(work.model)
    load = _cpu_sample()
    phases = {}
    for phase, make_steps in work.phases.items():
        if phase not in options.phases:
            continue
        index = _trace_index(config, phase, shape, compute, work.model, backend=_backend(work.model))
        count = options.new_tokens if phase == "decode" else options.prefill_runs
        warmup = options.warmup + (1 if phase == "decode" else 0)  # a decode iterator's first step is its prefill
        timed = run_phase(make_steps, ranges, phase=phase, warmup=warmup, count=count, rounds=options.rounds)
        phases[phase] = _phase(timed, index, positions, weights, roofs, tokens=work.tokens[phase],
                               element_size=dtypes.parse(compute).torch.itemsize)
    report = {
        "model": {"name": name, "architecture": config.architecture, "parameters": _parameters(work.model)},
        "options": {"batch": shape.batch, "prompt_len": shape.prompt_len, "context": shape.context,
                    "new_tokens": options.new_tokens, "prefill_runs": options.prefill_runs,
                    "compute_dtype": compute, "threads": torch.get_num_threads()},
        "machine": {**_machine(machine, compute), "op_latency_s": roofs.op_latency_s, "load": _load_note(load)},
        "positions": {k: {"label": label, "serves": serves} for k, (label, serves) in POSITIONS.items()},
        "phases": phases,
    }
    if hardware is not None:
        report["hardware"] = named_prediction(config, hardware, shape, compute, phases,
                                              weight_dtype=_weight_dtype(model, compute))
    return report


def measure_op_latency(*, calls: int = 2000, repeats: int = 5) -> float:
    """Seconds one small op takes on this machine, dispatch included: the best of `repeats` means
    over `calls` additions of two [1, 64] tensors (no profiler)."""
    import time

    a, b = torch.ones(1, 64), torch.ones(1, 64)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                torch.add(a, b)
            best = min(best, (time.perf_counter() - start) / calls)
    return best


def check_run(config: ModelConfig, options: ProfileOptions, weights: str, *, option: str | None = None,
              resident_bytes: int = 0) -> None:
    """A run that cannot fit the model's context or this machine's memory: a one-line InputError
    naming the limit, before anything runs. `option` names what asked for the run (a sweep value);
    `resident_bytes`: memory already taken by other models of the same command."""
    check_shape(config, Shape(options.batch, options.prompt_len, options.context_for(config)), options, option=option)
    needed = run_bytes(config, options, weights)
    available = _available_bytes()
    if available is not None and sum(needed.values()) + resident_bytes > available:
        parts = ", ".join(f"{k} {v / 2 ** 30:.2f} GiB" for k, v in needed.items())
        what = option or f"--batch-size {options.batch} with --context {options.context_for(config)}"
        raise InputError(f"{what} needs about {(sum(needed.values()) + resident_bytes) / 2 ** 30:.2f} GiB "
                         f"({parts}) but this machine has {available / 2 ** 30:.2f} GiB available")


def check_shape(config: ModelConfig, shape: Shape, options: ProfileOptions, *, option: str | None = None) -> None:
    """Sizes the model's context cannot hold: a one-line InputError naming the limit."""
    prefix = f"{option}: " if option else ""
    for name, value in (("batch-size", shape.batch), ("prompt-len", shape.prompt_len),
                        ("new-tokens", options.new_tokens), ("context", shape.context)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{prefix}--{name} {value!r} must be a positive integer")
    limit = config.max_seq_len
    if shape.prompt_len > limit:
        raise InputError(f"{prefix}--prompt-len {shape.prompt_len} exceeds the model's context of {limit} tokens "
                         "(max_seq_len)")
    if config.is_encoder:
        return
    if shape.context > limit:
        raise InputError(f"{prefix}--context {shape.context} exceeds the model's context of {limit} tokens "
                         "(max_seq_len)")
    prompt = shape.prompt_len if config.is_decoder else 0
    needed = prompt + options.warmup + options.new_tokens + 1
    if shape.context < needed:
        what = f"--prompt-len {shape.prompt_len} + " if prompt else ""
        raise InputError(f"{prefix}--context {shape.context} is too small: {what}{options.warmup} warm-up + "
                         f"--new-tokens {options.new_tokens} decode steps + 1 need {needed} cache slots")


def run_bytes(config: ModelConfig, options: ProfileOptions, weights: str) -> dict[str, int]:
    """What a run holds at once, about: the weights (`weights`: anatomy.load's choice; "auto" counted
    as f32, the most it can be), the KV cache of B x T slots, the prefill's largest activations (the
    widest projection's output, a few [B, S, D] tensors, the eager score matrix) and the logits.
    Activations and cache are counted in f32 for f32 weights, else in 16 bits (bf16 compute)."""
    from anatomy.analysis.memory import compute_dtype, kv_cache_bytes
    from anatomy.analysis.params import parameter_ledger

    stored = dtypes.parse("f32" if weights == "auto" else weights, choices=dtypes.ALL)
    act = dtypes.parse(compute_dtype(stored.name))
    B, S, T = options.batch, options.prompt_len, options.context_for(config)
    widest = max(config.q_dim + 2 * config.kv_dim, 2 * max(config.d_ff, config.d_ff_expert or 0))
    scores = B * config.n_heads * S * S if options.attention == "eager" else 0
    return {"weights": stored.nbytes(parameter_ledger(config).total),
            "KV cache": 0 if config.is_encoder else kv_cache_bytes(config, batch=B, tokens=T, kv_dtype=act.name,
                                                                     windowed=False),
            "activations": act.nbytes(B * S * (widest + 4 * config.d_model) + scores) + 4 * B * config.vocab_size}


def _available_bytes() -> int | None:
    """Memory the OS can give now (Linux: MemAvailable, free pages plus reclaimable cache; elsewhere
    the free pages); None where it cannot say."""
    import os

    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


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
        "tokens_per_step": tokens, "tok_per_s": tokens / plain,
        "predicted_step_s": predicted, "predicted_tok_per_s": tokens / predicted,
        "roofline_step_s": sum(o["roofline_s"] or 0.0 for o in ops),
        "positions": _positions(rows),
        "bounds": _by(ops, "bound"),
        "steps_measured": len(timed.events), "steps_used": len(steps),
        "miss": _miss(ops, predicted, plain),
        "ops": ops,
    }


def _middle_mean(values: list[float]) -> float:
    ranked = sorted(values)
    q = len(ranked) // 4 if len(ranked) >= 4 else 0
    return statistics.fmean(ranked[q:len(ranked) - q])


def _predicted_s(ops: list[dict], plain: float) -> float:
    """The rows a roof bounds at their roofline time, everything else as measured: the unprofiled
    step less the bound rows' measured time (so the profiler's own cost, which lands on the many
    small ops and the Python between them, is not predicted either)."""
    bound = [o for o in ops if o["bound"] != "overhead"]
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
    excess = sorted((o for o in ops if o["bound"] != "overhead"), key=lambda o: o["roofline_s"] - o["time_s"])
    return {"measured_s": measured, "predicted_s": predicted, "ratio": measured / predicted,
            "rows": [{"module": o["module"], "op": o["op"], "time_s": o["time_s"], "roofline_s": o["roofline_s"],
                      "excess_s": o["time_s"] - o["roofline_s"]} for o in excess[:MISS_ROWS]]}


def _cpu_sample() -> tuple[float, float, float] | None:
    """(seconds of CPU time all processes used, of it this process, wall seconds): Linux's /proc/stat."""
    import os
    import time

    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    mine = os.times()
    return busy / tick, mine.user + mine.system, time.monotonic()


def _load_note(before: tuple[float, float, float] | None) -> dict[str, Any]:
    """The share of the machine's CPU time other processes used during the run: they stretch every
    step (and stall intra-op threads waiting for each other), so a shared machine's times are slower
    than its speed."""
    import os

    after = _cpu_sample()
    cores = os.cpu_count() or 1
    if before is None or after is None or after[2] <= before[2]:
        return {"cores": cores, "others_cpu_share": None, "note": ""}
    others = max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / ((after[2] - before[2]) * cores)
    note = (f"other processes used {others:.0%} of the {cores} cores' time during the run: times are inflated"
            if others > BUSY_SHARE else "")
    return {"cores": cores, "others_cpu_share": others, "note": note}


def _machine(machine: Hardware, compute: str) -> dict[str, Any]:
    return {"name": machine.name, "bandwidth_bytes_per_s": machine.bandwidth,
            "peak_flops_per_s": machine.peak(compute), "peak_flops_per_s_by_dtype": dict(machine.peak_flops),
            "ridge_flops_per_byte": machine.peak(compute) / machine.bandwidth, "source": machine.source}


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
    from anatomy.analysis.params import parameter_ledger

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
