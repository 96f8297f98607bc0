"""A decode step captured as one graph: on a CPU, what CUDA graphs are on a GPU.

    body = capture_paged(stack, paged_cache, inputs, head=model)   # once per (batch, blocks read)
    out = body.paged(inputs)   # logits [B, V] (body.logits), else the last hidden states [B, D]

Why: a small model's eager decode step is bound by the Python around its operators. `torch.jit.trace`
records the step once, its weights and pools then bound into the graph; TorchScript replays the same
operators bit for bit without that Python. A trace holds only for the shapes it saw, so a mixture of
experts (routing by value) or a layer a trace cannot hold is not captured (None); the LM head joins
only where it can. `compile_paged` is the same body under torch.compile (CUDA graphs).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from anatomy.inference.engine.held import held_tensors
from anatomy.inference.engine.paged import BlockSlots
from anatomy.layers.pass_inputs import PassInputs
from anatomy.models.stack import Stack

FIELDS = ("mask", "bias", "input_pos", "window_mask")  # the PassInputs's tensors a decode step sets (besides angles)
ANGLES = ("rope", "sliding_rope")  # the PassInputs's (cos, sin) pairs


def signature(ctx: PassInputs) -> tuple[str, ...]:
    """Which of the PassInputs's tensors a step has: a trace holds for one such set."""
    return tuple(f for f in ANGLES + FIELDS if getattr(ctx, f) is not None)


def arguments(ctx: PassInputs) -> tuple[Tensor, ...]:
    """The PassInputs's tensors, in signature order (an angle pair as its two tensors)."""
    out: tuple[Tensor, ...] = ()
    for name in signature(ctx):
        value = getattr(ctx, name)
        out += value if name in ANGLES else (value,)
    return out


def context_of(names: tuple[str, ...], tensors: tuple[Tensor, ...]) -> PassInputs:
    """The PassInputs whose tensors `arguments` gave, by their signature."""
    fields, at = {}, 0
    for name in names:
        width = 2 if name in ANGLES else 1
        fields[name] = tuple(tensors[at:at + 2]) if width == 2 else tensors[at]
        at += width
    return PassInputs(**fields)


class PagedBody(nn.Module):
    """The blocks of one decode step over a paged cache: (ids [B, 1], positions [B, 1], slots [B],
    tables [B * nb] (and the window group's), the PassInputs's tensors) -> [B, D], or with `head` (the
    model, whose `logits` is its LM head) the logits [B, V]."""

    def __init__(self, stack: Stack, cache: nn.Module, names: tuple[str, ...], blocks: int, groups: int,
                 head: nn.Module | None = None) -> None:
        super().__init__()
        self.stack, self.cache, self.names, self.blocks, self.groups = stack, cache, names, blocks, groups
        self.head = head

    def forward(self, ids: Tensor, positions: Tensor, *tensors: Tensor) -> Tensor:
        n = 2 * self.groups
        where = BlockSlots.of(tensors[:n], ids.shape[0], 1, self.blocks)
        ctx = context_of(self.names, tensors[n:])
        hidden = self.stack.forward_pass(ids, ctx, position_ids=positions, cache=self.cache.layers(where))[:, -1]
        return hidden if self.head is None else self.head.logits(hidden)


class Captured:
    """A traced (or compiled) body, called with a paged step's inputs instead of its tensors;
    `logits`: it gives the LM head's logits (else the final hidden states); `held`: the tensors a
    traced body reads besides the step's own (the weights and pools), bound into its graph; `unit`: the
    compilation unit that holds the graph, and so those tensors, while this lives."""

    def __init__(self, traced, *, logits: bool = False, scripted: bool = True, held: tuple[Tensor, ...] = (),
                 unit=None) -> None:
        self.traced, self.logits, self.scripted, self.held, self.unit = traced, logits, scripted, held, unit

    def paged(self, inputs) -> Tensor:
        args = (inputs.ids, inputs.positions, *inputs.where.tensors(), *arguments(inputs.ctx))
        if not self.scripted:
            return self.traced(*args)
        # replayed as recorded: the graph executor's profiling and optimising passes cost time on
        # the first calls and gain nothing on a CPU (no fuser runs there by default)
        with torch.jit.optimized_execution(False):
            return self.traced(*args)


def capturable(stack: Stack, ctx: PassInputs) -> bool:
    """Does every decision of the stack's decode step depend on shapes only (no expert routing)?"""
    return not any(block.moe for block in stack.blocks) and ctx.router_logits is None


def capture_paged(stack: Stack, cache: nn.Module, inputs, *, head: nn.Module | None = None) -> Captured | None:
    """Trace the blocks of a paged decode step of this shape on its inputs, and `head` (the model: its
    LM head) after them where a trace can hold it. Tracing runs the step (writing its cache slots, which
    the real step then writes again with the same values). None when the stack cannot be captured."""
    if not capturable(stack, inputs.ctx):
        return None
    tensors = inputs.where.tensors()
    example = (inputs.ids, inputs.positions, *tensors, *arguments(inputs.ctx))
    names, groups = signature(inputs.ctx), len(tensors) // 2
    if head is not None:
        if (body := _trace(PagedBody(stack, cache, names, inputs.where.blocks, groups, head), example)) is not None:
            body.logits = True
            return body
    return _trace(PagedBody(stack, cache, names, inputs.where.blocks, groups), example)


def compile_paged(stack: Stack, cache: nn.Module, inputs, *, head: nn.Module, mode: str | None) -> Captured:
    """The body of a paged decode step of this shape under torch.compile (compiled on its first call)."""
    tensors = inputs.where.tensors()
    body = PagedBody(stack, cache, signature(inputs.ctx), inputs.where.blocks, len(tensors) // 2, head)
    return Captured(torch.compile(body.eval(), dynamic=False, mode=mode), logits=True, scripted=False)


def _trace(body: nn.Module, example: tuple[Tensor, ...]) -> Captured | None:
    """Trace the body as a function of its inputs and of every tensor it holds (weights, layouts, cache
    pools), those traced as inputs too: the traced function lives in TorchScript's own unit for the
    process's life, so it must hold none of them (a dropped engine would keep its weights). A function
    trace makes no ScriptModule of each submodule, as a module trace does."""
    held, n = held_tensors(body, skip=example), len(example)
    with warnings.catch_warnings(), torch.no_grad():  # parameters among the inputs: no autograd while tracing
        # deprecated for torch.compile; the route a planned layer picks by its row count is fixed by the shapes
        warnings.simplefilter("ignore")
        try:
            traced = torch.jit.trace(lambda *args: body(*args[:n]), example + held, check_trace=False)
        except RuntimeError:  # a layer holds an object a trace cannot (e.g. a packed-weight handle)
            return None
    _simplify(traced.graph)
    return _bound(traced.graph, n, held)


def _bound(traced: torch.Graph, n: int, held: tuple[Tensor, ...]) -> Captured:
    """The traced graph with the held tensors (its inputs after the first n) made its constants, in a
    compilation unit of its own: a replay converts only the step's few inputs, not the ~8 tensors a layer
    reads (weights, norms, pools) at every call, and the unit, dropped with the engine, frees them."""
    graph = traced.copy()
    inputs, first = list(graph.inputs()), next(iter(graph.nodes()))
    used = []
    for i in reversed(range(n, len(inputs))):
        if inputs[i].uses():
            constant = graph.insertConstant(held[i - n].detach())  # the same storage, read and written in place
            constant.node().moveBefore(first)
            inputs[i].replaceAllUsesWith(constant)
            used.append(held[i - n])
        graph.eraseInput(i)
    unit = torch._C.CompilationUnit()
    return Captured(unit.create_function("step", graph), held=tuple(reversed(used)), unit=unit)


def _simplify(graph: torch.Graph) -> None:
    """What freezing does to a graph: fold what its constants decide, merge repeats, drop the unused."""
    for _ in range(2):
        torch._C._jit_pass_peephole(graph)
        torch._C._jit_pass_constant_propagation(graph)
        torch._C._jit_pass_cse(graph)
        torch._C._jit_pass_dce(graph)
