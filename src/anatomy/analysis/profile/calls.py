"""A profiled step, taken apart: which range each op ran in, and the time between ops.

The profiler's events of one step form a tree of intervals (run.py names them): the step, the
module calls nested in it, and their aten ops. `calls(step)` flattens that into one Call per range:
its own top-level ops and its Python, the interval left when its ops and child ranges are taken out.
Summed over the calls, ops + Python + the step's own gap (time outside every range: unattributed)
is the step's duration exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anatomy.analysis.profile.run import ENGINE, MODULE, STEP

ENGINE_OWNER = "(engine)"  # ops of the step outside every module and stage


@dataclass
class Op:
    name: str  # the aten name without "aten::" (an anatomy:: operator's without "anatomy::")
    seconds: float
    via: str  # the op in its subtree with the most self time: the kernel that did the work
    events: int  # profiler events in its subtree, itself included


@dataclass
class Call:
    owner: str  # module path, "(engine)", or "engine:<stage>"
    ops: list[Op] = field(default_factory=list)
    python_s: float = 0.0
    events: int = 1  # profiler events of the range itself and its ops (not of child ranges)


@dataclass
class Step:
    seconds: float
    calls: list[Call]
    unattributed_s: float  # the step's own time outside every op and range
    events: int  # every profiler event in the step


def take_apart(step_event) -> Step:
    """The calls of one `anatomy.step:*` event."""
    calls: list[Call] = []
    own = _walk(step_event, ENGINE_OWNER, calls)
    total_events = sum(c.events for c in calls)
    return Step(seconds=_seconds(step_event), calls=calls, unattributed_s=own, events=total_events)


def _walk(event, owner: str, calls: list[Call]) -> float:
    """Append the Call of `event`'s range (and of every range inside it); the step's own gap is returned
    (for a step event its own ops belong to the engine)."""
    call = Call(owner)
    children_s = 0.0
    for child in event.cpu_children:
        seconds = _seconds(child)
        children_s += seconds
        name = child.name
        if name.startswith(MODULE):
            _walk(child, name[len(MODULE):], calls)
        elif name.startswith(ENGINE):
            _walk(child, "engine:" + name[len(ENGINE):], calls)
        elif name.startswith(STEP):  # a step inside a step: not ours to take apart
            call.ops.append(Op(name, seconds, name, _count(child)))
        else:
            op = Op(_short(name), seconds, _via(child), _count(child))
            call.ops.append(op)
            call.events += op.events
    gap = max(0.0, _seconds(event) - children_s)
    if event.name.startswith(STEP):
        calls.append(call)  # the engine's ops, no Python of its own: the step's gap is unattributed
        return gap
    call.python_s = gap
    calls.append(call)
    return 0.0


def _seconds(event) -> float:
    return (event.time_range.end - event.time_range.start) * 1e-6


def _short(name: str) -> str:
    """The op's name without its namespace: aten's, or anatomy's own operators (kernels/native)."""
    return name.removeprefix("aten::").removeprefix("anatomy::")


def _count(event) -> int:
    return 1 + sum(_count(c) for c in event.cpu_children)


def _via(event) -> str:
    """The op of the subtree with the largest self time (aten::linear's work is its aten::addmm)."""
    best, best_s = event, event.self_cpu_time_total
    stack = list(event.cpu_children)
    while stack:
        e = stack.pop()
        if e.self_cpu_time_total > best_s:
            best, best_s = e, e.self_cpu_time_total
        stack.extend(e.cpu_children)
    return _short(best.name)
