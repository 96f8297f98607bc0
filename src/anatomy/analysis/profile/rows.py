"""The measured steps of a phase as rows: one per trace row (summed over layers), per op the trace
does not have, and per module's Python; each with its time per step, FLOPs and bytes (from the
shape trace), roofline time on the measured machine and verdict.

The rows average the interquartile steps (robust to a step another process slowed, and still
additive: a phase's rows sum to its step time). Verdicts: `communication` (a parallel run's
collectives), `overhead` (work per call below what one small op takes, or nothing to put on a
roof: dispatch, Python, glue), else `compute` or `bandwidth`, the roof that bounds it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from anatomy.analysis.flops import attended_pairs
from anatomy.analysis.hardware import INTEGER_PRODUCTS
from anatomy.analysis.profile.calls import Step
from anatomy.analysis.profile.match import RowKey, TraceIndex, canonical
from anatomy.analysis.profile.positions import position_of
from anatomy.analysis.profile.weights import LinearWeight, WeightTable
from anatomy.analysis.trace import TraceRow

PYTHON = "(python)"
CAUSAL_KERNELS = ("causal_attention",)  # anatomy's kernel reads each query's keys up to its own only


@dataclass
class Row:
    key: RowKey
    position: str
    trace: TraceRow | None
    time_s: float = 0.0  # per step
    calls: float = 0.0  # per step
    events: float = 0.0  # profiler events per step (for its cost)
    via: Counter = field(default_factory=Counter)
    weight: LinearWeight | None = None  # a linear row's weight: its real bytes, as loaded and as read
    weight_delta: int = 0  # real bytes the call reads for the weight minus the bytes the trace counted
    computed: float = 1.0  # the share of the trace's FLOPs the kernel that ran computes (a causal one: ~half)

    @property
    def flops(self) -> float | None:
        return None if self.trace is None else self.trace.flops * self.calls * self.computed

    def weight_per_step(self, field: str) -> float | None:
        """A linear row's weight bytes (`field`: loaded_bytes, read_bytes) or plan seconds (plan_s) per step."""
        value = None if self.weight is None else getattr(self.weight, field)
        return None if value is None else value * self.calls

    @property
    def bytes(self) -> float | None:
        if self.trace is None:
            return None
        return (self.trace.bytes + self.weight_delta) * self.calls


@dataclass(frozen=True)
class Roofs:
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    op_latency_s: float  # one small op's time: below this per call, no roof explains an op
    integer: dict[str, float] = field(default_factory=dict)  # the integer products' peaks (hardware.py)

    def peak(self, row: Row) -> float:
        """The compute roof of a row: its planned kernel's integer products' peak where measured, else the
        compute dtype's matmul peak."""
        products = row.weight.products if row.weight is not None else None
        return self.integer.get(INTEGER_PRODUCTS.get(products, ""), self.peak_flops_per_s)

    def time(self, flops: float, nbytes: float, peak: float) -> float:
        return max(flops / peak, nbytes / self.bandwidth_bytes_per_s)

    def bound(self, flops: float, nbytes: float, peak: float) -> str:
        return "compute" if flops / peak >= nbytes / self.bandwidth_bytes_per_s else "bandwidth"


def middle_steps(steps: list[Step]) -> list[Step]:
    """The steps whose time lies in the interquartile range (all of them when there are fewer than 4)."""
    if len(steps) < 4:
        return steps
    ranked = sorted(steps, key=lambda s: s.seconds)
    q = len(ranked) // 4
    return ranked[q:len(ranked) - q]


def build_rows(steps: list[Step], index: TraceIndex, positions: dict[str, str], weights: WeightTable, *,
               element_size: int) -> list[Row]:
    """The rows of `steps` (already the chosen ones), averaged per step, in first-seen order.
    `weights`: the real bytes of the linear layers' weights; `element_size`: bytes per value of the
    dtype the trace was recorded in."""
    def new(key: RowKey, owner: str, trace_row: TraceRow | None) -> Row:
        return _new_row(key, owner, trace_row, positions, weights, element_size)

    rows: dict[RowKey, Row] = {}
    n = len(steps)
    for step in steps:
        for call in step.calls:
            seen: set[RowKey] = set()
            names = [op.name for op in call.ops]
            for op, (key, trace_row) in zip(call.ops, index.match(call.owner, names)):
                row = rows.get(key) or rows.setdefault(key, new(key, call.owner, trace_row))
                if op.name in CAUSAL_KERNELS and trace_row is not None:
                    row.computed = causal_share(trace_row)
                row.time_s += op.seconds / n
                row.events += op.events / n
                row.via[op.via] += op.seconds
                if key not in seen:
                    row.calls += 1 / n
                    seen.add(key)
            if call.python_s > 0 or call.owner.startswith("engine:"):
                module, kind = index.kind(call.owner)
                key = RowKey(module, kind, -2, PYTHON)
                row = rows.get(key) or rows.setdefault(key, new(key, call.owner, None))
                row.time_s += call.python_s / n
                row.events += 1 / n  # the range's own event
                row.calls += 1 / n
    return list(rows.values())


def causal_share(trace_row: TraceRow) -> float:
    """The share of an attention row's query-key pairs a causal kernel computes: those at or before each
    query, of a fresh prompt (its keys [.., T, d] are its queries' positions: the case the kernel runs)."""
    T = trace_row.inputs[1][-2]
    return attended_pairs(T, T, causal=True) / (T * T) if T else 1.0


def _new_row(key: RowKey, owner: str, trace_row: TraceRow | None, positions: dict[str, str],
             weights: WeightTable, element_size: int) -> Row:
    """A row; a linear's weight bytes (the trace counts them at its dtype) are replaced by the real
    bytes its kernel reads (profile/weights.py)."""
    weight = weights.of(owner, trace_row) if trace_row is not None else None
    row = Row(key, position_of(owner, key.op, positions), trace_row, weight=weight)
    if weight is not None:
        numel = 1
        for d in weight.shape:
            numel *= d
        row.weight_delta = weight.bytes - numel * element_size
    return row


def row_dict(row: Row, roofs: Roofs) -> dict[str, Any]:
    """A row as the --json `ops` entry."""
    flops, nbytes, t = row.flops, row.bytes, row.time_s
    peak = roofs.peak(row)
    roof = roofs.time(flops, nbytes, peak) if flops is not None else None
    per_call = roof / row.calls if roof is not None and row.calls else 0.0
    if row.position == "communication":
        bound = "communication"  # the transfer and the wait for the other ranks: no roof of this machine's
    elif roof is None or (per_call < roofs.op_latency_s and t > roof):
        bound = "overhead"
    else:
        bound = roofs.bound(flops, nbytes, peak)
    module = row.key.module + (f" ({row.key.kind})" if row.key.kind else "")
    trace = row.trace
    return {
        "module": module, "op": row.key.op, "position": row.position,
        "shapes": {"inputs": trace.inputs, "output": trace.output} if trace is not None else None,
        "calls": round(row.calls, 3), "flops": flops, "bytes": nbytes, "time_s": t,
        "flops_per_s": flops / t if flops is not None and t > 0 else None,
        "bytes_per_s": nbytes / t if nbytes is not None and t > 0 else None,
        "roofline_s": roof, "bound": bound,
        "via": row.via.most_common(1)[0][0] if row.via else None,
        "weight_bytes": row.weight_per_step("loaded_bytes"), "kernel": row.weight.kernel if row.weight else None,
        "kernel_weight_bytes": row.weight_per_step("read_bytes"), "plan_time_s": row.weight_per_step("plan_s"),
    }


def grouped(rows: list[Row], by: str = "position") -> dict[str, float]:
    """Time per step by position (or by any attribute of the rows)."""
    out: dict[str, float] = defaultdict(float)
    for row in rows:
        out[getattr(row, by)] += row.time_s
    return dict(out)


__all__ = ["Roofs", "Row", "build_rows", "canonical", "grouped", "middle_steps", "row_dict"]
