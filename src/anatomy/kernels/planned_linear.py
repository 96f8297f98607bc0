"""PlannedLinear: a linear layer that runs the kernel a KernelPlan chose for the number of rows.

    layer = PlannedLinear.from_plan(plan, "blocks.0.attn.qkv.weight", fmt)   # fmt: the layer's WeightFormat
    y = layer(x)                                                          # x [..., K] -> y [..., N]

x is cast to the chosen kernel's activation dtype and y to the layer's `dtype` only when they differ,
so a model already in the kernel's dtype makes no casts. forward does no host synchronisation: the
number of rows picks one of a few routes, each bound to its prepared layout (past the batch rows, an
engine step's rows far from a sampled one take the layout's fastest kernel: sampled_rows.py). The layouts are
machine-specific (built when the layer is made, a prefill-only one at the first long prompt) and not
in the state dict: save the format, not this module. CPU only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import Tensor, nn

from anatomy.errors import InputError
from anatomy.weights.formats import WeightFormat
from anatomy.kernels.candidates import KERNELS, Form, Kernel, Prepared
from anatomy.kernels.piecewise import build_consuming
from anatomy.kernels import sampled_rows
from anatomy.kernels.plan import fastest, for_prompts
from anatomy.kernels.record import KernelPlan, WeightPlan
from anatomy.kernels.timing import Phase

Route = tuple[int, torch.dtype | None, Callable[[Tensor], Tensor]]  # (max rows, activation dtype or None for
                                                                       # any, x [M, K] -> [M, N])


class PlannedLinear(nn.Module):
    """y = x @ W^T (+ bias) through the planned kernel per phase."""

    def __init__(self, routes: list[Route], *, in_features: int, out_features: int, bias: Tensor | None = None,
                 dtype: torch.dtype = torch.float32, layouts: dict[str, Prepared] | None = None,
                 opaque_bytes: int = 0, description: str = "") -> None:
        super().__init__()
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        self._routes = routes
        self.layouts = layouts or {}  # layout name -> prepared tensors (kept alive; for inspection)
        self.opaque_bytes = opaque_bytes  # bytes of layouts that are not tensors (FBGEMM's packed weight)
        self.description = description
        self.builds_later = False  # a layout is still to be built from the format (its first long prompt)
        self.bulk: Route | None = None  # the last route's rows far from a sampled one (sampled_rows.py), if faster
        self.consumed = False  # its layout was built discarding the format's rows (from_plan's consume)
        self.bias = None if bias is None else bias.detach().to(dtype)  # a plain attribute: read per call, cheaply

    @classmethod
    def from_plan(cls, plan: KernelPlan, name: str, fmt: WeightFormat, *, bias: Tensor | None = None,
                  dtype: torch.dtype = torch.float32, kernels: tuple[Kernel, ...] = KERNELS,
                  consume: Callable[[Form], bool] | None = None) -> PlannedLinear:
        """The layer `name` of `plan`, its layouts built from `fmt` (which must have the planned signature).
        A layout only the last phase (a prefill's any number of rows) reads is built at its first call
        of more rows than that phase was timed on; calls of fewer rows are computed meanwhile on the held
        layout's kernel the plan's prompt rule picks (plan.for_prompts: int8 activations can flip a
        prompt's near-tie), a piece of its rows at a time. `consume`: a layer holding one layout whose
        form keeps the rows in order, and which consume(form) allows, builds it from pieces of fmt,
        discarding each piece's stored rows (piecewise.py); `layer.consumed` says whether it did, and then
        fmt must be released."""
        w = plan.for_layer(name)
        if fmt.signature != w.signature:
            raise InputError(f"layer {name!r}: the plan is for {w.signature}, the weight given is {fmt.signature}")
        by_name = {k.name: k for k in kernels}
        chosen = [(phase, by_name[w.choices[phase.name]]) for phase in plan.phases_of(w)]
        forms = {k.form.name: k.form for _, k in chosen}  # the plan's w.forms
        lazy = chosen[-1][1].form if len(chosen) > 1 and _only_last(chosen) else None
        sole = next(iter(forms.values())) if lazy is None and len(forms) == 1 else None
        consumed = consume is not None and sole is not None and sole.piece_rows > 0 and consume(sole)
        layouts = {name: build_consuming(form, fmt) if consumed else form.build(fmt)
                   for name, form in forms.items() if form is not lazy}  # each built once
        routes = [(phase.max_rows, k.act_dtype, k.bind(layouts[k.form.name])) for phase, k in chosen[:-1]]
        text = ", ".join(f"{phase.name} {k.name}" for phase, k in chosen)
        N, K = fmt.shape
        layer = cls(routes, in_features=K, out_features=N, bias=bias, dtype=dtype, layouts=layouts,
                    opaque_bytes=_opaque_bytes(forms, layouts, fmt), description=f"{w.signature}: {text}")
        last_phase, last = chosen[-1]
        layer.builds_later = lazy is not None
        layer.consumed = consumed
        if lazy is None:
            layer._routes.append((sys.maxsize, last.act_dtype, last.bind(layouts[last.form.name])))
            bulk = _bulk_kernel(w, last, by_name)
            if bulk is not None:
                layer.bulk = (sys.maxsize, bulk.act_dtype, bulk.bind(layouts[bulk.form.name]))
                layer.description += f" ({bulk.name} far from sampled rows)"
        else:
            meanwhile = _for_prompts(w, chosen, by_name)
            route = (sys.maxsize, meanwhile.act_dtype, meanwhile.bind(layouts[meanwhile.form.name]))
            layer._routes.append((sys.maxsize, None, layer._pending(last, fmt, forms, wait_rows=last_phase.rows,
                                                                    meanwhile=route, piece=meanwhile.max_rows)))
        return layer

    def _pending(self, kernel: Kernel, fmt: WeightFormat, forms: dict, *, wait_rows: int, meanwhile: Route,
                 piece: int | None) -> Callable[[Tensor], Tensor]:
        """The last route before its layout is built: up to `wait_rows` rows through `meanwhile` (`piece`
        rows a call); the first larger call builds the layout and takes the kernel's own route."""
        def call(x: Tensor) -> Tensor:
            if x.shape[0] <= wait_rows:
                return torch.cat([_through(meanwhile, part) for part in x.split(piece or wait_rows)])
            self.layouts[kernel.form.name] = kernel.form.build(fmt)
            self.builds_later = False
            self.opaque_bytes = _opaque_bytes(forms, self.layouts, fmt)
            self._routes[-1] = (sys.maxsize, kernel.act_dtype, kernel.bind(self.layouts[kernel.form.name]))
            return _through(self._routes[-1], x)

        return call

    @classmethod
    def with_kernel(cls, kernel: Kernel, fmt: WeightFormat, *, bias: Tensor | None = None,
                    dtype: torch.dtype = torch.float32) -> PlannedLinear:
        """One kernel for every number of rows, unmeasured (comparisons, quality checks)."""
        if not kernel.supports(fmt):
            raise InputError(f"kernel {kernel.name!r} cannot compute with {fmt.signature} on this machine")
        layout = kernel.form.build(fmt)
        N, K = fmt.shape
        layouts = {kernel.form.name: layout}
        return cls([(sys.maxsize, kernel.act_dtype, kernel.bind(layout))], in_features=K, out_features=N, bias=bias,
                   dtype=dtype, layouts=layouts, opaque_bytes=_opaque_bytes({kernel.form.name: kernel.form}, layouts, fmt),
                   description=f"{fmt.signature}: {kernel.name}")

    def forward(self, x: Tensor) -> Tensor:
        K = self.in_features
        rows = x.numel() // K
        if rows == 0:  # a step whose chunks want no logits (a long prompt's first chunks): no kernel call
            return x.new_zeros(*x.shape[:-1], self.out_features, dtype=self.dtype)
        for route in self._routes:
            if rows <= route[0]:
                break
        spans = sampled_rows.runs(rows) if self.bulk is not None and route is self._routes[-1] else None
        if spans is None or len(spans) == 1 and spans[0][2]:
            y = _through(route, x.reshape(rows, K))  # [M, K] -> [M, N]
        else:  # all rows on the bulk kernel, then those near a sampled row again: no copy of the whole output
            flat = x.reshape(rows, K)
            y = _through(self.bulk, flat)
            for a, b, near in spans:
                if near:
                    y[a:b] = _through(route, flat[a:b])
        if y.dtype != self.dtype:
            y = y.to(self.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.description}, layouts {'+'.join(self.layouts)}, out {self.dtype}"


def _for_prompts(w: WeightPlan, chosen: list[tuple[Phase, Kernel]], by_name: dict[str, Kernel]) -> Kernel:
    """The kernel a prompt's rows take on the first phase's layout until the last phase's own is built:
    the plan's prompt rule (plan.for_prompts) over the last phase's measurements on that layout."""
    held, (last, _) = chosen[0][1], chosen[-1]
    forms = {name: k.form.name for name, k in by_name.items()}
    m = for_prompts(w.measurements.get(last.name, []), forms, {held.form.name})
    return by_name[m.kernel] if m is not None else held


def _bulk_kernel(w: WeightPlan, last: Kernel, by_name: dict[str, Kernel]) -> Kernel | None:
    """The last phase's fastest kernel on the prompt kernel's layout (plan.fastest), where it is another."""
    forms = {name: k.form.name for name, k in by_name.items()}
    m = fastest(w.measurements.get(w.phases[-1], []), forms, {last.form.name})
    return by_name[m.kernel] if m is not None and m.kernel != last.name else None


def _only_last(chosen: list[tuple[Phase, Kernel]]) -> bool:
    """Is the last phase's layout one no earlier phase reads?"""
    return all(k.form.name != chosen[-1][1].form.name for _, k in chosen[:-1])


def _through(route: Route, x: Tensor) -> Tensor:
    """x [M, K] through a route's kernel, cast to its activation dtype first where it takes one."""
    _, act, fn = route
    return fn(x if act is None or x.dtype == act else x.to(act))


def _opaque_bytes(forms: dict, layouts: dict[str, Prepared], fmt: WeightFormat) -> int:
    """The bytes of the layouts that hold something other than tensors, as their form counts them."""
    return sum(forms[name].nbytes(fmt) for name, layout in layouts.items()
               if not all(isinstance(t, Tensor) for t in layout))
