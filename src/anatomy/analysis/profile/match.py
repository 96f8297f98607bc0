"""Which row of the shape trace each timed op is: the same rows `anatomy inspect` prints.

The trace (analysis/trace.py) and the profiler see the same torch calls, in the same order, under
the module that made them; per module call the two sequences of names are aligned (difflib), and
a module whose trace has one row (a linear layer, a norm) takes all of its ops as that row.
Block paths lose their index (`stack.blocks.7.attn` -> `stack.blocks.*.attn`): the times sum over
layers, and each kind of layer (sliding windows, mixture FFNs) is matched against its own trace.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from anatomy.analysis.trace import TraceRow
from anatomy.config import ModelConfig

_BLOCK = re.compile(r"\.blocks\.(\d+)(?=\.|$)")
# torch call names (the trace) and aten names (the profiler) that are one op under two names
_SAME = {"split_with_sizes": "split", "select": "getitem", "slice": "getitem", "index": "getitem",
         "radd": "add", "iadd": "add_", "rmul": "mul", "truediv": "div", "rsub": "sub", "float": "to",
         # anatomy's own operators for the torch call
         "decode_attention": "scaled_dot_product_attention", "causal_attention": "scaled_dot_product_attention"}
ATTENTION = "scaled_dot_product_attention"  # the one op a trace row and a timed op may pair by name alone


def canonical(path: str) -> tuple[str, int | None]:
    """(`stack.blocks.*.attn`, 7) for `stack.blocks.7.attn`; (path, None) outside the blocks."""
    match = _BLOCK.search(path)
    if match is None:
        return path, None
    return _BLOCK.sub(".blocks.*", path), int(match.group(1))


def op_name(name: str) -> str:
    """One name for the torch call and its aten op: `__getitem__` and aten `select` are `getitem`."""
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
    return _SAME.get(name, name)


@dataclass(frozen=True)
class RowKey:
    module: str  # canonical path
    kind: str  # the kind of layer ("" when the stack's layers are all alike)
    index: int  # the row's place among its module's rows; -1: an op the trace does not have
    op: str  # the trace's op name, or the aten name of an op the trace does not have


class TraceIndex:
    """The trace rows of each (canonical module, kind of layer), and the alignment of op names to them."""

    def __init__(self, rows_by_kind: dict[str, list[TraceRow]], kind_of_layer: dict[int, str]) -> None:
        self.kind_of_layer = kind_of_layer
        self.rows: dict[tuple[str, str], list[TraceRow]] = {}
        for kind, rows in rows_by_kind.items():
            for row in rows:
                module, layer = canonical(row.module)
                key = (module, kind if layer is not None else "")
                if layer is None and kind != next(iter(rows_by_kind)):
                    continue  # the ends of the model: taken from the first kind's trace
                self.rows.setdefault(key, []).append(row)
        self._aligned: dict[tuple, list[int | None]] = {}

    def kind(self, path: str) -> tuple[str, str]:
        module, layer = canonical(path)
        return module, self.kind_of_layer.get(layer, "") if layer is not None and _is_main_stack(path) else ""

    def match(self, path: str, names: list[str]) -> list[tuple[RowKey, TraceRow | None]]:
        """The row of each op (by name, in order) of one call of module `path`."""
        module, kind = self.kind(path)
        rows = self.rows.get((module, kind), [])
        key = (module, kind, tuple(names))
        if key not in self._aligned:
            self._aligned[key] = _align([op_name(r.op) for r in rows], [op_name(n) for n in names])
        out = []
        for name, index in zip(names, self._aligned[key]):
            if index is None:
                out.append((RowKey(module, kind, -1, name), None))
            else:
                out.append((RowKey(module, kind, index, rows[index].op), rows[index]))
        return out


def _is_main_stack(path: str) -> bool:
    """Layer kinds (windows, experts) belong to a decoder-only model's one stack."""
    return path.startswith("stack.")


def _align(trace: list[str], ops: list[str]) -> list[int | None]:
    """For each op, the index of the trace row it is, or None."""
    if len(trace) == 1:
        return [0] * len(ops)  # one torch call: every aten op it ran (a swapped kernel's too) is it
    out: list[int | None] = [None] * len(ops)
    matcher = difflib.SequenceMatcher(None, trace, ops, autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            out[block.b + k] = block.a + k
    return _pair_unique(trace, ops, out)


def _pair_unique(trace: list[str], ops: list[str], out: list[int | None]) -> list[int | None]:
    """An attention op left unmatched is the module's one unmatched attention row, where each side has one:
    the trace lays out the glue around it otherwise (the cache's gathers and repeats)."""
    taken = set(out)
    rows = [i for i, name in enumerate(trace) if name == ATTENTION and i not in taken]
    unmatched = [j for j, (name, index) in enumerate(zip(ops, out)) if name == ATTENTION and index is None]
    if len(rows) == 1 and len(unmatched) == 1:
        out[unmatched[0]] = rows[0]
    return out


def layer_kinds(config: ModelConfig) -> tuple[dict[str, int], dict[int, str]]:
    """({kind label: the first layer of that kind}, {layer: kind label}) of a decoder-only stack:
    one kind ("") when all layers are alike, else labels like "window 4096" or "experts"."""
    if not config.is_decoder:
        return {"": 0}, {}
    def label(i: int) -> str:
        parts = [f"window {config.layer_window(i)}"] if config.layer_window(i) else []
        parts += ["experts"] if config.layer_is_moe(i) else []
        return ", ".join(parts) or "dense, full attention"

    labels = {i: label(i) for i in range(config.n_layers)}
    if len(set(labels.values())) == 1:
        return {"": 0}, {i: "" for i in labels}
    first: dict[str, int] = {}
    for i, kind in labels.items():
        first.setdefault(kind, i)
    return first, labels
