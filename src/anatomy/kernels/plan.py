"""The measured kernel plan: which kernel computes each linear layer's product, per phase.

    plan = make_plan(formats, model_id="<model>:<file digest>", weights="gguf")  # formats: {layer: WeightFormat}
    layer = PlannedLinear.from_plan(plan, "blocks.0.attn.qkv.weight", formats["blocks.0.attn.qkv.weight"])

Weights of one signature (format, shape, group) are measured once. For each phase (decode, batch,
prefill) every candidate is checked against the float64 product (`threshold`) and timed; per
signature one compact layout serving all phases best is held (ties within TIE go to the most
accurate), a second only when MIN_GAIN faster and within the memory budget. Every decision keeps
its timings and errors, and the plan is cached on disk (plan_cache). docs/inference.md has the rules.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from anatomy import heap
from anatomy.errors import InputError
from anatomy.kernels import cache as plan_cache
from anatomy.sizes import parse_bytes
from anatomy.weights.formats import WeightFormat
from anatomy.kernels.candidates import KERNELS, Kernel
from anatomy.kernels.record import KernelPlan, WeightPlan, by_kernel
from anatomy.kernels.timing import Measurement, Phase, measure_weight

# torch's int4pack kernel dequantizes its weights once per block of 4 rows, so 1-4 rows cost alike and
# decode's phase ends there; many rows favour a GEMM on a dense copy (bench_kernels measures where)
DECODE = Phase("decode", rows=1, max_rows=4)
BATCH = Phase("batch", rows=8, max_rows=8)
PREFILL = Phase("prefill", rows=128, max_rows=None)
DEFAULT_PHASES = (DECODE, BATCH, PREFILL)
ERROR_THRESHOLD = 1e-2  # relative (Frobenius) error of a kernel's output against the float64 product
MIN_GAIN = 0.10  # a second layout must make a phase at least this much faster
TIE = 0.05  # kernels within this much of the fastest are tied: the most accurate of them is chosen
COMPACT = 1.25  # a layout of at most this many times the format's bytes is held without a budget
PROMPT_ERROR = 1e-4  # a prompt's rows run on the fastest held kernel this accurate (else the most accurate one)
LAYOUT_BUDGET_ENV = "ANATOMY_LAYOUT_BUDGET"  # bytes allowed for second layouts ("2GiB", "0.25" of RAM); 0 by default
REPEATS = 5
RULES = 2  # the choosing rules' version, part of a cached plan's key: a plan chosen by older rules is measured again


# -- making a plan -------------------------------------------------------------------------------

@dataclass
class _Group:
    """Layers measured together: one signature, one set of phases."""

    signature: str
    phases: tuple[Phase, ...]
    members: list[tuple[str, WeightFormat]]
    threshold: float


def make_plan(linears: Mapping[str, WeightFormat], *, model_id: str, weights: str,
              phases: tuple[Phase, ...] = DEFAULT_PHASES, phases_of: Mapping[str, Sequence[str]] | None = None,
              kernels: tuple[Kernel, ...] = KERNELS, threshold: float = ERROR_THRESHOLD,
              memory_budget: int | None = None,
              samples: Mapping[str, Tensor] | Callable[[], Mapping[str, Tensor]] | None = None,
              repeats: int = REPEATS, cache: bool | str | Path = True,
              thresholds: Mapping[str, float] | None = None) -> KernelPlan:
    """The kernel plan for `linears` ({layer name: its weight format}), from the cache when a plan
    with the same key is stored there, else measured now and stored (unless cache=False), noisy or
    not: every later start takes the same path (`anatomy doctor --replan` measures noisy ones again).

    model_id: identifies the model's weights (e.g. name + file digest); weights: the weights choice
    ("gguf", "f16", ...). phases_of: {layer name: names of the phases it sees} for layers that do
    not see all (the last of its phases serves any larger number of rows). memory_budget: bytes
    allowed for second layouts over the whole model (default: layout_budget(), 0 unless set).
    samples: activations [S, K] per layer name for the accuracy check (standard normal ones
    otherwise). cache: True (the default directory), a directory, or False. thresholds: {layer name:
    its own accuracy threshold} for layers held to another standard (an LM head's products are the
    logits themselves).
    """
    _check_phases(phases)
    budget = layout_budget() if memory_budget is None else int(memory_budget)
    groups = _group(linears, phases, phases_of or {}, thresholds or {}, threshold)
    key = _key(groups, model_id=model_id, weights=weights, phases=phases, kernels=kernels, threshold=threshold,
               budget=budget)
    path = None if cache is False else plan_cache.plan_path(key, None if cache is True else Path(cache))
    if path is not None:
        stored = plan_cache.load_entry(path, key)
        plan = _valid_plan(stored, groups, phases, kernels) if stored is not None else None
        if plan is not None:
            plan.from_cache, plan.path = True, path
            return plan
    plan = measure_plan(groups, phases=phases, kernels=kernels, threshold=threshold, budget=budget,
                        samples=samples() if callable(samples) else samples, repeats=repeats)
    if path is not None:
        plan_cache.save_entry(path, key, plan.to_json())
        plan.path = path
    return plan


def _check_phases(phases: tuple[Phase, ...]) -> None:
    limits = [p.max_rows for p in phases]
    ok = phases and all(p.rows >= 1 for p in phases) and None not in limits[:-1] and \
        all(p.max_rows is None or p.rows <= p.max_rows for p in phases) and \
        all(a < b for a, b in itertools.pairwise(limits) if b is not None) and \
        len({p.name for p in phases}) == len(phases)
    if not ok:
        raise InputError(f"phases {phases}: each must measure rows >= 1 within its max_rows, with distinct names, "
                         "max_rows increasing and only the last one unbounded (None)")


def layout_budget(value: str | None = None) -> int:
    """Bytes allowed for second layouts: `value` (or $ANATOMY_LAYOUT_BUDGET) as bytes ("2GiB", "512MB",
    "1e9") or a fraction of physical memory ("0.25"); 0 when unset, so a model holds one layout per
    weight, about the file's bytes, as llama.cpp does."""
    text = os.environ.get(LAYOUT_BUDGET_ENV, "0") if value is None else value
    return parse_bytes(text, option=LAYOUT_BUDGET_ENV if value is None else "layout budget")


def _group(linears: Mapping[str, WeightFormat], phases: tuple[Phase, ...], phases_of: Mapping[str, Sequence[str]],
           thresholds: Mapping[str, float], threshold: float) -> dict[str, _Group]:
    """{group key: _Group} in first-seen order; the key is the signature (+ the phases when limited,
    + the threshold when a layer has its own)."""
    if not linears:
        raise InputError("make_plan needs at least one linear layer")
    unknown = sorted((set(phases_of) | set(thresholds)) - set(linears))
    if unknown:
        raise InputError(f"phases_of or thresholds name layers that are not given: {unknown}")
    groups: dict[str, _Group] = {}
    for name, fmt in linears.items():
        if not isinstance(fmt, WeightFormat):
            raise InputError(f"layer {name!r}: expected a WeightFormat, got {type(fmt).__name__}")
        own = _own_phases(name, phases, phases_of)
        limit = thresholds.get(name, threshold)
        key = fmt.signature if own == phases else f"{fmt.signature} ({'+'.join(p.name for p in own)})"
        key += "" if limit == threshold else f" (error <= {limit:g})"
        groups.setdefault(key, _Group(fmt.signature, own, [], limit)).members.append((name, fmt))
    return groups


def _own_phases(name: str, phases: tuple[Phase, ...], phases_of: Mapping[str, Sequence[str]]) -> tuple[Phase, ...]:
    if name not in phases_of:
        return phases
    wanted = list(phases_of[name])
    own = tuple(p for p in phases if p.name in wanted)
    if not own or len(own) != len(set(wanted)):
        raise InputError(f"phases_of[{name!r}] = {wanted}: must name some of the phases {[p.name for p in phases]}")
    return own


def _key(groups: dict[str, _Group], *, model_id: str, weights: str, phases: tuple[Phase, ...],
         kernels: tuple[Kernel, ...], threshold: float, budget: int) -> dict[str, Any]:
    key = {"rules": RULES, "machine": plan_cache.machine_key(), "model": model_id, "weights": weights,
           "phases": [[p.name, p.rows, p.max_rows] for p in phases], "threshold": threshold,
           "kernels": [k.name for k in kernels], "budget_bytes": budget,
           "layers": {k: [name for name, _ in g.members] for k, g in groups.items()}}
    return json.loads(json.dumps(key))  # the form it has after a round trip through the file


def _valid_plan(stored: dict[str, Any], groups: dict[str, _Group], phases: tuple[Phase, ...],
                kernels: tuple[Kernel, ...]) -> KernelPlan | None:
    """The stored plan if it is well formed and every choice is a kernel that supports its format now."""
    try:
        plan = KernelPlan.from_json(stored)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    by_name = {k.name: k for k in kernels}
    if plan.phases != tuple(phases) or list(plan.weights) != list(groups):
        return None
    for key, g in groups.items():
        w, fmt = plan.weights[key], g.members[0][1]
        names = [p.name for p in g.phases]
        if w.phases != names or set(w.choices) != set(names) or w.layers != [n for n, _ in g.members]:
            return None
        if not all(k in by_name and by_name[k].supports(fmt) and by_name[k].form.name in w.forms
                   for k in w.choices.values()):
            return None
        if not all(phase in w.measurements and k in by_kernel(w.measurements[phase]) for phase, k in w.choices.items()):
            return None
    return plan


def measure_plan(groups: dict[str, _Group], *, phases: tuple[Phase, ...], kernels: tuple[Kernel, ...],
                 threshold: float, budget: int, samples: Mapping[str, Tensor] | None = None,
                 repeats: int = REPEATS) -> KernelPlan:
    """Measure every group's candidates now and decide (no cache), with progress on a terminal."""
    from anatomy import progress

    start = time.perf_counter()
    plans = {}
    with progress.task("measuring kernels (first use)", total=len(groups)) as bar:
        for key, g in groups.items():
            name, fmt = g.members[0]
            bar.update(info=g.signature)
            sample = (samples or {}).get(name)
            ms = _measure(fmt, g, kernels if budget else compact_kernels(fmt, kernels), repeats, sample)
            if not all(any(m.eligible for m in phase) for phase in ms.values()):  # no compact kernel is accurate
                ms = _measure(fmt, g, kernels, repeats, sample)
            plans[key] = _fastest_layouts(key, g, ms, kernels)
            heap.trim()  # the candidates' layouts and pools are freed: the next weight's must not stack on them
            bar.advance()
    extra = _allot_second_layouts(plans, budget, {k.name: k.form.name for k in kernels})
    spreads = [m.spread for w in plans.values() for ms in w.measurements.values() for m in ms if m.spread is not None]
    return KernelPlan(phases=tuple(phases), weights=plans, threshold=threshold, budget_bytes=budget,
                      extra_bytes=extra, measure_seconds=time.perf_counter() - start,
                      noise=statistics.median(spreads) if spreads else 0.0)


def _measure(fmt: WeightFormat, g: _Group, kernels: tuple[Kernel, ...], repeats: int,
             sample: Tensor | None) -> dict[str, list[Measurement]]:
    return measure_weight(fmt, phases=g.phases, kernels=kernels, threshold=g.threshold, repeats=repeats, sample=sample)


def compact_kernels(fmt: WeightFormat, kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    """The kernels on compact layouts of `fmt` (at most COMPACT times its bytes: compact_bytes): with no
    budget for a second layout no other is held, so no other is built or timed (unless none of them is
    accurate). All of them where none is compact."""
    bound = compact_bytes(fmt, kernels)
    ok = tuple(k for k in kernels if k.supports(fmt) and k.form.nbytes(fmt) <= COMPACT * bound)
    return ok or kernels


def compact_bytes(fmt: WeightFormat, kernels: tuple[Kernel, ...]) -> int:
    """The bytes a compact layout is measured against: the weight packed as tightly as its values allow
    (4-bit indices for codes of a table) where some layout here comes within COMPACT of that, else the
    format's own bytes (a machine without such a layout holds the codes as they are, never a wider copy)."""
    tight = any(k.supports(fmt) and k.form.nbytes(fmt) <= COMPACT * fmt.packed_nbytes for k in kernels)
    return fmt.packed_nbytes if tight else fmt.nbytes


def _fastest_layouts(key: str, g: _Group, ms: dict[str, list[Measurement]], kernels: tuple[Kernel, ...]) -> WeightPlan:
    """Every phase on the first phase's layout (second layouts are allotted later)."""
    fmt = g.members[0][1]
    forms = {k.name: k.form.name for k in kernels}
    names = [p.name for p in g.phases]
    form_bytes = {k.form.name: k.form.nbytes(fmt) for k in kernels if k.supports(fmt)}
    accurate = tuple(k for k in kernels if any(m.kernel == k.name and m.eligible for m in sum(ms.values(), [])))
    first = _first_layout(ms, names, forms, form_bytes, compact_bytes(fmt, accurate))
    if first is None:
        raise InputError(f"{g.signature} ({g.members[0][0]}): no kernel computed it accurately at phase {names[0]!r}: "
                         + "; ".join(f"{m.kernel}: {m.note}" for m in ms[names[0]]))
    w = WeightPlan(key=key, signature=g.signature, phases=names, layers=[n for n, _ in g.members], nbytes=fmt.nbytes,
                   choices={}, forms=[forms[first.kernel]], measurements=ms,
                   form_bytes=form_bytes)
    for phase in names:
        pick = for_prompts if phase == names[-1] and len(names) > 1 else fastest
        on_held = pick(ms[phase], forms, set(w.forms))
        best = fastest(ms[phase], forms, None)
        if best is None:
            raise InputError(f"{g.signature}: no kernel computed it accurately at phase {phase!r}")
        w.choices[phase] = (on_held or best).kernel
        if on_held is None:
            w.forms.append(forms[best.kernel])
            w.reasons[phase] = "needs a second layout: no kernel on the first layout serves these rows"
    return w


def _first_layout(ms: dict[str, list[Measurement]], names: list[str], forms: dict[str, str],
                  form_bytes: dict[str, int], nbytes: int) -> Measurement | None:
    """The first phase's fastest kernel on the held layout: of the compact layouts (at most COMPACT times
    `nbytes`, compact_bytes; a wider copy is only ever a second layout, paid from the budget), the one that
    serves every phase best together: the least summed slowdown against each phase's fastest kernel on
    any compact layout (ties: the faster first phase). Where none serves every phase, the first phase's
    fastest kernel on any layout."""
    compact = {f for f, b in form_bytes.items() if b <= COMPACT * nbytes}
    best = {p: fastest(ms[p], forms, compact) for p in names}
    if any(b is None for b in best.values()):
        return fastest(ms[names[0]], forms, None)
    costs = {}
    for layout in compact:
        on = [(for_prompts if p == names[-1] and len(names) > 1 else fastest)(ms[p], forms, {layout}) for p in names]
        if all(o is not None for o in on):
            slowdown = sum(o.seconds / max(best[p].seconds, 1e-12) for o, p in zip(on, names))
            costs[layout] = (slowdown, on[0].seconds, on[0])
    return min(costs.values(), key=lambda c: c[:2])[2]


def for_prompts(ms: list[Measurement], forms: dict[str, str], allowed: set[str] | None) -> Measurement | None:
    """The kernel a prompt's rows (the last, unbounded phase) go through on an allowed layout: the fastest
    eligible one within PROMPT_ERROR (int16 or float activations), else the one of the smallest error (ties:
    the faster): int8 activations flip near-ties of the first answer token that int16 or float ones keep."""
    ok = [m for m in ms if m.eligible and m.kernel in forms and (allowed is None or forms[m.kernel] in allowed)]
    close = [m for m in ok if m.error is not None and m.error <= PROMPT_ERROR]
    if close:
        return min(close, key=lambda m: m.seconds)
    return min(ok, key=lambda m: (math.inf if m.error is None else m.error, m.seconds), default=None)


def fastest(ms: list[Measurement], forms: dict[str, str], allowed: set[str] | None) -> Measurement | None:
    """The fastest eligible measurement whose kernel's layout (forms: kernel -> layout) is allowed; of
    those within TIE of it, the most accurate (a tie is noise; the error is not)."""
    ok = [m for m in ms if m.eligible and m.kernel in forms and (allowed is None or forms[m.kernel] in allowed)]
    if not ok:
        return None
    best = min(m.seconds for m in ok)
    tied = [m for m in ok if m.seconds <= (1 + TIE) * best]
    return min(tied, key=lambda m: (math.inf if m.error is None else m.error, m.seconds))


def _allot_second_layouts(plans: dict[str, WeightPlan], budget: int, forms: dict[str, str]) -> int:
    """Give weights a second layout where it pays (per weight the layout of the largest gain; across
    weights the largest gain per byte first, while the budget lasts); -> extra bytes held."""
    offers = []
    for w in plans.values():
        if len(w.forms) > 1:
            continue  # already holds two
        options = {forms.get(m.kernel) for ms in w.measurements.values() for m in ms if m.eligible}
        gains = [(*_gain(w, form, forms), form) for form in options - {w.forms[0], None}]
        gain, moves, form = max(gains, key=lambda g: (g[0], -w.form_bytes[g[2]]), default=(0.0, {}, None))
        if moves:
            cost = w.form_bytes[form] * len(w.layers)
            offers.append((gain / max(cost, 1), gain, cost, w, form, moves))
    spent = sum(w.form_bytes[f] * len(w.layers) for w in plans.values() for f in w.forms[1:])
    for _, gain, cost, w, form, moves in sorted(offers, key=lambda o: -o[0]):
        if spent + cost > budget:
            for phase in moves:
                w.reasons[phase] = f"{moves[phase]} on a second layout {form} would be faster; its " \
                                   f"{cost / 2 ** 20:.1f} MiB do not fit the memory budget"
            continue
        spent += cost
        w.forms.append(form)
        for phase, kernel in moves.items():
            w.choices[phase] = kernel
            w.reasons[phase] = f"second layout {form}: {cost / 2 ** 20:.1f} MiB over {len(w.layers)} layers"
    return spent


def _gain(w: WeightPlan, form: str, forms: dict[str, str]) -> tuple[float, dict[str, str]]:
    """(summed relative time saved over the phases, {phase: kernel} it would switch) by adding `form`."""
    gain, moves = 0.0, {}
    for phase in w.phases:
        current = w.seconds(phase)
        best = fastest(w.measurements[phase], forms, {form})
        if best is not None and current > 0 and best.seconds < (1 - MIN_GAIN) * current:
            gain += 1 - best.seconds / current
            moves[phase] = best.kernel
    return gain, moves
