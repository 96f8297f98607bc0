"""Running a model's steps under torch.profiler, every module call and engine stage named.

    ranges = NamedRanges(engine.model)     # a record_function range per module call of the engine's view
    timed = run_phase(make_steps, ranges, phase="decode", warmup=3, count=12)

Each profiled step (one `next()` of an iterator of steps) is a range `anatomy.step:<phase>` holding
`anatomy.module:<path>` and `anatomy.engine:<stage>` ranges and the aten ops under them. The same
steps also run unprofiled, so the profiler's own cost is measured: `Timed.plain_s`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

STEP = "anatomy.step:"
MODULE = "anatomy.module:"
ENGINE = "anatomy.engine:"
ROOT = "(model)"  # the root module's name, as the shape trace calls it


class NamedRanges:
    """A record_function range around every module call of `model` while entered (hooks removed on exit)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.handles: list = []

    def __enter__(self) -> NamedRanges:
        from anatomy.analysis.profile.positions import profiled_paths

        paths = profiled_paths(self.model)
        for name, module in self.model.named_modules():
            if paths[name] is None:
                continue  # a parallel module's wrapper: its child takes its path, its collectives their own range
            label = MODULE + (paths[name] or ROOT)
            stack: list[record_function] = []
            self.handles.append(module.register_forward_pre_hook(_enter(label, stack)))
            self.handles.append(module.register_forward_hook(_exit(stack), always_call=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def _enter(label: str, stack: list[record_function]):
    def hook(module, args):
        rf = record_function(label)
        rf.__enter__()
        stack.append(rf)

    return hook


def _exit(stack: list[record_function]):
    def hook(module, args, output):
        if stack:
            stack.pop().__exit__(None, None, None)

    return hook


def named_stage(label: str, fn: Callable) -> Callable:
    """`fn` run inside an `anatomy.engine:<label>` range (for engine stages that are not modules)."""

    def wrapped(*args, **kwargs):
        with record_function(ENGINE + label):
            return fn(*args, **kwargs)

    return wrapped


@dataclass
class Timed:
    """One phase's measured steps: the profiler's events of each profiled step, and the wall-clock
    seconds of the same steps run without profiler and hooks."""

    phase: str
    events: list = field(default_factory=list)  # FunctionEvent of each profiled step range
    profiled_s: list[float] = field(default_factory=list)  # perf_counter seconds of the profiled steps
    plain_s: list[float] = field(default_factory=list)  # perf_counter seconds without profiler and hooks
    production_s: list[float] = field(default_factory=list)  # the same, of the production step (if given)


def time_steps(steps: Iterator, *, warmup: int, count: int) -> list[float]:
    """Seconds of `count` steps after `warmup` unmeasured ones (no profiler)."""
    for _ in range(warmup):
        next(steps)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        next(steps)
        times.append(time.perf_counter() - start)
    return times


def profile_steps(steps: Iterator, *, phase: str, warmup: int, count: int) -> tuple[list, list[float]]:
    """(the profiler's event of each step's range, perf_counter seconds of each) for `count` steps
    after `warmup` unprofiled ones."""
    for _ in range(warmup):
        next(steps)
    times = []
    prof = profile(activities=[ProfilerActivity.CPU])
    with _quiet_stderr():  # kineto prints a line to stderr at every start and stop
        prof.start()
    try:
        for _ in range(count):
            start = time.perf_counter()
            with record_function(STEP + phase):
                next(steps)
            times.append(time.perf_counter() - start)
    finally:
        with _quiet_stderr():
            prof.stop()
    events = [e for e in prof.events() if e.name == STEP + phase and e.cpu_parent is None]
    return events, times


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 pointed at the null device (the C++ side writes there directly)."""
    sys.stderr.flush()
    try:
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no descriptor 2 to redirect
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def run_phase(make_steps: Callable[[], Iterator], ranges: NamedRanges, *, phase: str, warmup: int, count: int,
              rounds: int = 2, production=None) -> Timed:
    """`rounds` alternations of plain and profiled runs of `count` steps each (the machine's load
    changes over seconds: alternating puts both under the same conditions); `production` (a
    workloads.Production): its steps timed as the plain ones in each round, after its own warm-up."""
    timed = Timed(phase)
    per_round = max(1, count // rounds)
    for _ in range(rounds):
        with torch.inference_mode():
            timed.plain_s += time_steps(make_steps(), warmup=warmup, count=per_round)
            if production is not None:
                timed.production_s += time_steps(production.steps(), warmup=warmup + production.warmup,
                                                 count=per_round)
            with ranges:
                events, seconds = profile_steps(make_steps(), phase=phase, warmup=warmup, count=per_round)
        timed.events += events
        timed.profiled_s += seconds
    return timed
