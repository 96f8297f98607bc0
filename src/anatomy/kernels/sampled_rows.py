"""Which rows of a forward pass lie near a sampled position: there products keep the prompt rule's kernel.

    with near_sampled(wanted, rows=T):    # wanted: the pass's row indices whose logits are taken
        hidden = stack.forward_pass(...)  # a PlannedLinear of T rows asks runs(T)

Past the plan's batch rows, a PlannedLinear runs the rows within TAIL before a sampled one on the prompt
rule's kernel (plan.for_prompts: int16 or float activations) and the others on the plan's fastest kernel on
the same layout (int8 activations where those are fastest, as llama.cpp computes a whole prompt). A near-tie
of the next token is decided by the rows around it; the keys and values further back take int8's error.
Outside such a pass, or for a product of other rows (an LM head, an expert's share), every row keeps it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from anatomy.errors import InputError

TAIL = 16  # rows up to and including a sampled one that keep the prompt kernel: one tile's rows

Runs = list[tuple[int, int, bool]]  # (start, stop, near a sampled row), end to end over the pass's rows

_pass: ContextVar[tuple[int, Runs] | None] = ContextVar("anatomy_sampled_rows", default=None)


@contextmanager
def near_sampled(wanted: Sequence[int], rows: int) -> Iterator[Runs]:
    """Within it, a product over all `rows` rows of the pass splits them as `runs` says; -> the runs."""
    spans = split_rows(wanted, rows)
    token = _pass.set((rows, spans))
    try:
        yield spans
    finally:
        _pass.reset(token)


def runs(rows: int) -> Runs | None:
    """The current pass's runs for a product of `rows` rows; None outside a pass or for other rows."""
    current = _pass.get()
    return current[1] if current is not None and current[0] == rows else None


def split_rows(wanted: Sequence[int], rows: int) -> Runs:
    """Rows 0..rows-1 as runs: near (within TAIL rows up to a wanted one) or not; merged, in order."""
    near = [False] * rows
    for w in wanted:
        if not 0 <= w < rows:
            raise InputError(f"wanted row {w} lies outside the pass's {rows} rows")
        for i in range(max(0, w - TAIL + 1), w + 1):
            near[i] = True
    out: Runs = []
    for i, flag in enumerate(near):
        if out and out[-1][2] == flag:
            out[-1] = (out[-1][0], i + 1, flag)
        else:
            out.append((i, i + 1, flag))
    return out
