"""The real bytes of each linear layer's weight: as loaded, and as its kernel reads it.

    as loaded    the format the model holds (weights/formats.py): a compact format's codes and scales
    as read      the layout the engine's kernel plan chose for this number of rows (kernels/plan.py)

A decode step's GEMM reads the layout its planned kernel runs on, so an op's roofline counts those
bytes, with the format's beside them. Without a plan (an encoder, a seq2seq model) the weight is
read as loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from anatomy.analysis.trace import TraceRow


@dataclass(frozen=True)
class LinearWeight:
    shape: tuple[int, ...]  # [N, K]
    loaded_bytes: int
    kernel: str | None = None  # the planned kernel for this call's rows
    read_bytes: int | None = None  # bytes of the layout that kernel reads
    plan_s: float | None = None  # the plan's measured seconds per call of that kernel
    products: str | None = None  # that kernel's integer products (kernels/candidates.py), None: float

    @property
    def bytes(self) -> int:
        """What a call reads: the kernel's layout when the plan is known, else the weight as loaded."""
        return self.read_bytes if self.read_bytes is not None else self.loaded_bytes


class WeightTable:
    """The weights of a model's linear layers (by module path), and the engine's plan for them."""

    def __init__(self, model: nn.Module, plan=None) -> None:
        from anatomy.analysis.profile.positions import profiled_paths

        paths = profiled_paths(model)  # a parallel shard's local layer is profiled under its wrapper's path
        self.real = {label: path for path, label in paths.items() if label is not None and label != path}
        self.loaded = {self._label(paths, path): value for path, value in loaded_weights(model).items()}
        self.plan = plan

    @staticmethod
    def _label(paths: dict[str, str | None], path: str) -> str:
        return paths.get(path) or path

    def of(self, path: str, row: TraceRow) -> LinearWeight | None:
        """The weight a trace row (a linear call of module `path`) reads, or None for other rows."""
        loaded = self.loaded.get(path)
        if row.op != "linear" or loaded is None or len(row.inputs) < 2 or tuple(row.inputs[1]) != loaded[0]:
            return None
        shape, nbytes = loaded
        planned = self._planned(path, _rows(row))
        return LinearWeight(shape, nbytes, *planned) if planned else LinearWeight(shape, nbytes)

    def _planned(self, path: str, rows: int) -> tuple[str, int, float, str | None] | None:
        """(kernel, layout bytes, plan seconds, its integer products) that PlannedLinear routes `rows` rows
        to: the first phase whose max_rows holds them, the last phase for any more."""
        if self.plan is None:
            return None
        from anatomy.errors import InputError
        from anatomy.kernels.candidates import KERNELS_BY_NAME

        try:
            w = self.plan.for_layer(f"{self.real.get(path, path)}.weight")
        except InputError:
            return None
        phases = self.plan.phases_of(w)
        phase = next((p for i, p in enumerate(phases) if i == len(phases) - 1 or rows <= (p.max_rows or rows)),
                     None)
        if phase is None:
            return None
        kernel = KERNELS_BY_NAME[w.choices[phase.name]]
        return kernel.name, w.form_bytes[kernel.form.name], w.seconds(phase.name), kernel.products


def loaded_weights(model: nn.Module) -> dict[str, tuple[tuple[int, ...], int]]:
    """{module path: (weight shape, bytes as loaded)} of every module with a weight: a compact format
    (weights/modules.py) reports its own `nbytes` (codes and scales); a float weight is numel * element_size."""
    out = {}
    for path, module in model.named_modules():
        fmt = getattr(module, "compact", None)
        weight = getattr(module, "weight", None)
        if fmt is not None and hasattr(fmt, "nbytes"):
            out[path] = (tuple(fmt.shape), int(fmt.nbytes))
        elif isinstance(weight, torch.Tensor):
            out[path] = (tuple(weight.shape), weight.numel() * weight.element_size())
    return out


def _rows(row: TraceRow) -> int:
    """The rows of a linear call: its input's numel over K."""
    x, k = row.inputs[0], row.inputs[1][-1]
    numel = 1
    for d in x:
        numel *= d
    return numel // k
