"""Checking and timing the candidate kernels of one weight, the measurements a kernel plan is made of.

Per phase, each candidate's product is compared with the float64 product on the dequantized weight:
one above the threshold, or that raises, is recorded with the reason and never timed. The others are
timed in interleaved rounds and the fastest round kept (other work can only slow a round down).
Few-row products cycle through copies of the layout larger than the last-level cache (POOL_ROWS,
MAX_COPIES), as a decode step reads each weight cold; many-row products are timed on one layout.
A candidate several times slower than the fastest in the first pass is "pruned".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from anatomy import heap
from anatomy.weights.formats import FloatWeight, WeightFormat
from anatomy.kernels.candidates import Kernel, Prepared, candidates, reference_product, relative_error

MAX_COPIES = 64
POOL_ROWS = 32  # phases of up to this many rows are timed on a cache-exceeding pool of copies
POOL_SHARE = 4  # a weight's pools together take at most 1 / POOL_SHARE of the memory available
PASS_SECONDS = 0.002  # a timed pass makes this many seconds of calls (at least one call)
MAX_CALLS = 10_000  # and at most this many
PRUNE_FACTOR = 6.0
DEFAULT_LLC_BYTES = 32 * 2 ** 20
clock = time.perf_counter  # the timer (tests substitute a virtual one)


@dataclass(frozen=True)
class Phase:
    """Inputs of up to `max_rows` rows (None: any) use the kernel chosen by timing `rows` rows."""

    name: str
    rows: int
    max_rows: int | None


@dataclass(frozen=True)
class Measurement:
    """One candidate kernel on one weight shape at one phase."""

    kernel: str
    seconds: float | None  # seconds per call in the fastest round; None when not timed
    error: float | None  # relative error against the float64 reference; None when it did not run
    note: str = ""  # "", "pruned: ...", "inaccurate: ...", "failed: ..."
    spread: float | None = None  # (slowest - fastest round) / fastest: the noise it was measured under

    @property
    def eligible(self) -> bool:
        """Accurate and timed: the plan may choose it."""
        return self.seconds is not None

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "seconds": self.seconds, "error": self.error, "note": self.note,
                "spread": self.spread}

    @classmethod
    def from_json(cls, d: dict) -> Measurement:
        return cls(str(d["kernel"]), _opt_float(d["seconds"]), _opt_float(d["error"]), str(d["note"]),
                   _opt_float(d["spread"]))


def _opt_float(v: object) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"not a non-negative number: {v!r}")
    return float(v)


def measure_weight(fmt: WeightFormat, *, phases: tuple[Phase, ...], kernels: tuple[Kernel, ...], threshold: float,
                   repeats: int, sample: Tensor | None = None) -> dict[str, list[Measurement]]:
    """{phase name: a Measurement per candidate kernel of `fmt`} (kernels limited to fewer rows left out)."""
    cands = candidates(fmt, kernels)
    built, failed = _build_forms(fmt, cands)
    pools: dict[str, list[Prepared]] = {}
    free = heap.available()
    budget = free // POOL_SHARE // max(1, len(built)) if free is not None else None  # bytes per form's pool
    out = {}
    for phase in phases:
        runnable = [k for k in cands if k.max_rows is None or phase.rows <= k.max_rows]
        x = _activations(sample, phase.rows, fmt.shape[1])  # [M, K] float32
        checked, timed = _check(fmt, runnable, built, failed, x, threshold)
        for k, _ in timed:
            if phase.rows <= POOL_ROWS and k.form.name not in pools:
                pools[k.form.name] = _pool(fmt, k, built[k.form.name], budget)
        layouts = {k.name: pools[k.form.name] if phase.rows <= POOL_ROWS else [built[k.form.name]] for k, _ in timed}
        times = _time([(k, [k.bind(p) for p in layouts[k.name]], xk) for k, xk in timed], repeats)
        out[phase.name] = [_finish(m, times.get(m.kernel)) for m in checked]
    return out


def _build_forms(fmt: WeightFormat, cands: list[Kernel]) -> tuple[dict[str, Prepared], dict[str, str]]:
    built, failed = {}, {}
    for k in cands:
        name = k.form.name
        if name in built or name in failed:
            continue
        try:
            built[name] = k.form.build(fmt)
        except Exception as e:  # noqa: BLE001 - a kernel this torch build cannot prepare is a candidate less
            failed[name] = f"failed: building {name}: {type(e).__name__}: {e}"
    return built, failed


def _activations(sample: Tensor | None, rows: int, K: int) -> Tensor:
    """rows of the given sample [S, K] (cycled), or standard normal ones from a fixed seed."""
    if sample is not None:
        sample = sample.reshape(-1, K).float()
        return sample[torch.arange(rows) % sample.shape[0]]
    return torch.randn(rows, K, generator=torch.Generator().manual_seed(0))


def _check(fmt: WeightFormat, kernels: list[Kernel], built: dict[str, Prepared], failed: dict[str, str],
           x: Tensor, threshold: float) -> tuple[list[Measurement], list[tuple[Kernel, Tensor]]]:
    """Each kernel's accuracy on x: (a Measurement per kernel, the accurate ones with their input)."""
    ref = reference_product(fmt, x)  # [M, N] float64
    checked, accurate = [], []
    for k in kernels:
        if k.form.name in failed:
            checked.append(Measurement(k.name, None, None, failed[k.form.name]))
            continue
        xk = x if k.act_dtype is None else x.to(k.act_dtype)  # None: the kernel takes any float dtype
        try:
            y = k.bind(built[k.form.name])(xk)
        except Exception as e:  # noqa: BLE001 - recorded, never chosen
            checked.append(Measurement(k.name, None, None, f"failed: {type(e).__name__}: {e}"))
            continue
        err = relative_error(y, ref) if tuple(y.shape) == tuple(ref.shape) else math.inf
        if err > threshold:
            checked.append(Measurement(k.name, None, err, f"inaccurate: error {err:.1e} > {threshold:.0e}"))
            continue
        checked.append(Measurement(k.name, None, err))
        accurate.append((k, xk))
    return checked, accurate


def _pool(fmt: WeightFormat, kernel: Kernel, prepared: Prepared, budget: int | None = None) -> list[Prepared]:
    """Copies of a built form that together exceed the last-level cache (at most MAX_COPIES, and no more
    bytes than `budget` beyond the first: a machine short of memory times on fewer)."""
    nbytes = max(1, kernel.form.nbytes(fmt))
    n = max(1, min(MAX_COPIES, math.ceil(2 * llc_bytes() / nbytes)))
    if budget is not None:
        n = max(1, min(n, 1 + budget // nbytes))
    if all(isinstance(t, Tensor) for t in prepared):
        return [prepared] + [tuple(t.clone() for t in prepared) for _ in range(n - 1)]
    dense = FloatWeight(fmt.dequantize())  # opaque packed objects (FBGEMM's): built again, from one dequantization
    return [prepared] + [kernel.form.build(dense) for _ in range(n - 1)]


def _time(entries: list[tuple[Kernel, list[Callable[[Tensor], Tensor]], Tensor]],
          repeats: int) -> dict[str, tuple[float, float | None]]:
    """{kernel name: (seconds per call in the fastest round, spread of the rounds; None when pruned)}."""
    if not entries:
        return {}
    for _, fns, x in entries:
        fns[0](x)  # first-call costs (primitive creation, page faults) stay out of the timing
    firsts = {k.name: _first_pass(fns, x) for k, fns, x in entries}
    first = {name: seconds for name, (seconds, _) in firsts.items()}
    best = min(first.values())
    for k, fns, x in entries:  # a pass that met a spike of the host prunes nothing: pruning takes a second pass
        if first[k.name] > PRUNE_FACTOR * best:
            first[k.name] = min(first[k.name], _first_pass(fns, x)[0])
    calls = {k.name: max(1, min(MAX_CALLS, round(PASS_SECONDS / max(first[k.name], 1e-9)))) for k, _, _ in entries}
    live = [e for e in entries if first[e[0].name] <= PRUNE_FACTOR * best]
    samples: dict[str, list[float]] = {k.name: [] for k, _, _ in live}
    start = {k.name: firsts[k.name][1] % len(fns) for k, fns, _ in live}  # go on where the first pass stopped
    for r in range(repeats):
        for k, fns, x in live[r % len(live):] + live[:r % len(live)]:  # a different order each round
            samples[k.name].append(_pass(fns, x, start[k.name], calls[k.name]))
            start[k.name] = (start[k.name] + calls[k.name]) % len(fns)
    out = {name: (first[name], None) for name in first}
    out.update({name: _summary(s) for name, s in samples.items()})
    return out


def _summary(s: list[float]) -> tuple[float, float]:
    fastest = min(s)
    return fastest, (max(s) - fastest) / fastest if fastest > 0 else 0.0


def _first_pass(fns: list[Callable[[Tensor], Tensor]], x: Tensor) -> tuple[float, int]:
    """(seconds per call, calls) of calls through fns until the pool or PASS_SECONDS is exhausted."""
    t0 = now = clock()
    calls = 0
    while calls < len(fns) and (calls == 0 or now - t0 < PASS_SECONDS):
        fns[calls](x)
        calls += 1
        now = clock()
    return (now - t0) / calls, calls


def _pass(fns: list[Callable[[Tensor], Tensor]], x: Tensor, start: int, calls: int) -> float:
    """Seconds per call of `calls` consecutive calls cycling through fns from `start`."""
    n = len(fns)
    t0 = clock()
    for i in range(calls):
        fns[(start + i) % n](x)
    return (clock() - t0) / calls


def _finish(m: Measurement, timing: tuple[float, float | None] | None) -> Measurement:
    if timing is None:
        return m
    seconds, spread = timing
    note = f"pruned: over {PRUNE_FACTOR:g}x the fastest in the first pass" if spread is None else m.note
    return Measurement(m.kernel, seconds, m.error, note, spread)


def llc_bytes() -> int:
    """The largest CPU cache (Linux sysfs), or DEFAULT_LLC_BYTES where it cannot be read."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=DEFAULT_LLC_BYTES)
