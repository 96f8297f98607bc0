"""Every tensor a model's modules hold, found by walking their attributes: what a captured step takes as
inputs (capture.py) and what the engine moves onto huge pages (huge_pages.py)."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn


def held_tensors(model: nn.Module, *, skip: Iterable[Tensor] = ()) -> tuple[Tensor, ...]:
    """Every tensor the modules hold, once each, but those in `skip`: parameters, buffers, and the
    tensors in their attributes' lists, tuples, dicts and closures (a fused block's weights, a layer's
    layouts and the kernels bound to them)."""
    seen, out = {id(t) for t in skip}, []

    def visit(value, depth: int) -> None:
        if isinstance(value, Tensor):
            if id(value) not in seen:
                seen.add(id(value))
                out.append(value)
        elif depth and isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth - 1)
        elif depth and isinstance(value, dict):
            for item in value.values():
                visit(item, depth - 1)
        elif depth and callable(value) and getattr(value, "__closure__", None):  # a bound kernel's tensors
            for cell in value.__closure__:
                try:
                    contents = cell.cell_contents
                except ValueError:  # a cell not set yet
                    continue
                visit(contents, depth - 1)

    for module in model.modules():
        for value in vars(module).values():
            visit(value, 4)
    return tuple(out)
