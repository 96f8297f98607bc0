"""The engine's view made fast: each linear layer runs the kernel the measured plan chose for it.

    plan = plan_view(view)      # view: the engine's own copy of the model (inference/view.py)

Every linear weight is read as a format; kernels.plan measures its candidate kernels on the model's
shapes and checks their accuracy on the layer's real inputs (the LM head's ten times tighter: its
products are the logits); each layer becomes a PlannedLinear. When every block linear's kernels take
one dtype (`branch_dtype`) the branches compute in it; the residual stream, the norms and the logits
keep the model's dtype, since a low-precision residual stream flips near-ties of the next token.
The caller's model is not touched. The steps in full: docs/inference.md, "The measured kernel plan".
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from collections.abc import Callable

import torch
from torch import nn

from anatomy import heap
from anatomy.kernels.calibration import calibration_inputs
from anatomy.kernels.candidates import COMPILABLE_KERNELS, KERNELS, KERNELS_BY_NAME, Form
from anatomy.kernels.plan import make_plan
from anatomy.kernels.record import KernelPlan
from anatomy.kernels.layout_embedding import LayoutEmbedding
from anatomy.kernels.planned_linear import PlannedLinear
from anatomy.weights.formats import FloatWeight, WeightFormat, storage_id
from anatomy.weights.modules import CompactEmbedding, CompactLinear

HEAD_LAYERS = {"lm_head.weight", "lm_head.local.weight"}  # the latter: a vocabulary-parallel shard's (parallel/)
HEAD_PHASES = ("decode", "batch")  # the LM head computes the last position of each row only
# its products are the logits, where near-ties between tokens are decided: int8 activations per group
# of 32 (llama.cpp's Q8 product, anatomy's q8x) can flip a greedy answer's token, an fp16 copy and the
# int8 weights decoded in float32 (q8f) do not (docs/inference.md, "The measured kernel plan")
HEAD_THRESHOLD = 1e-3
FORMS = {k.form.name: k.form for k in KERNELS}


def plan_view(view: nn.Module, *, compile: bool = False, cache: bool = True,
              layout_budget: int | None = None, take_weights: bool = False, dense: bool = False) -> KernelPlan | None:
    """Measure (or load) the kernel plan of the view's linear layers and swap them for PlannedLinear
    layers giving the branch dtype (the LM head: the model's). `layout_budget`: bytes for second
    layouts (None: plan.layout_budget()). `take_weights`: each compact format's memory is given back
    as soon as its layer's layouts are built (WeightFormat.release), so that the process never holds
    the model twice. Returns the plan; None with `dense` or on a GPU, where every layer is a dense
    product in the model's dtype (dense_kernels: the torch backend's)."""
    layers = linear_layers(view)
    keep = shared_storages(view, layers) if take_weights else set()
    if dense or next(view.parameters()).device.type != "cpu":
        dense_kernels(view, layers)
        return None
    formats = {name: fmt for name, (fmt, _) in layers.items()}
    plan = make_plan(formats, model_id=model_id(view), weights=_weights_label(formats),
                     phases_of={name: HEAD_PHASES for name in layers if name in HEAD_LAYERS},
                     thresholds={name: HEAD_THRESHOLD for name in layers if name in HEAD_LAYERS},
                     kernels=COMPILABLE_KERNELS if compile else KERNELS, cache=cache, memory_budget=layout_budget,
                     samples=lambda: calibration_inputs(view, list(layers)))
    model_dtype = view.stack.embed.dtype
    branch = branch_dtype(plan, model_dtype)
    readers = Counter(sid for fmt, _ in layers.values() for sid in {storage_id(t) for t in fmt.buffers()})
    consumed = []  # formats whose rows were discarded as their layouts were built
    trimmer = heap.Trimmer()  # the next layouts must not be built beside freed pages the heap kept
    try:
        for name, (fmt, bias) in layers.items():
            dtype = model_dtype if name in HEAD_LAYERS else branch
            consume = consumable(view, name, fmt, layers, keep, readers) if take_weights else None
            layer = PlannedLinear.from_plan(plan, name, fmt, bias=bias, dtype=dtype, consume=consume)
            view.set_submodule(name.removesuffix(".weight"), layer)
            consumed += [fmt] if layer.consumed else []
            if take_weights and not layer.builds_later:
                held = {storage_id(t) for layout in layer.layouts.values() for t in layout if isinstance(t, torch.Tensor)}
                trimmer.freed(fmt.release(keep | held))
        if take_weights:
            trimmer.freed(embed_from_head(view, layers))
        trimmer.flush()
    finally:  # whatever happened, a format that lost rows reads as given back (an InputError), never as zeros
        kept = [fmt.label for fmt in consumed if not fmt.released]
        for fmt in consumed:
            fmt.release()
    if kept:
        raise RuntimeError(f"weights built piecewise were still read after: {', '.join(kept)}")
    return plan


def consumable(view: nn.Module, name: str, fmt: WeightFormat, layers: dict, keep: set[int],
               readers: Counter) -> Callable[[Form], bool] | None:
    """Which forms layer `name` may build discarding fmt's rows as it goes (piecewise.py; None: none):
    any, where no other layer and nothing outside the layers reads fmt's storages; for the LM head of a
    tied token table read nowhere else, one that gives the table its rows (embed_from_head) ."""
    stored = {storage_id(t) for t in fmt.buffers()}
    if any(readers[sid] > 1 for sid in stored):
        return None
    if not stored & keep:
        return lambda form: True
    table = getattr(view, "token_embedding", None)
    if (name in HEAD_LAYERS and isinstance(table, CompactEmbedding) and table.compact is fmt
            and not stored & shared_storages(view, layers, besides=table)):
        return lambda form: form.rows is not None
    return None


def embed_from_head(view: nn.Module, layers: dict) -> int:
    """A token table tied to the LM head reads its rows from the head's layout where the layout's form
    can give them exactly (Form.rows), and the table's format is given back: the matrix is held once.
    -> bytes given back."""
    table = getattr(view, "token_embedding", None)
    head = next((name for name in layers if name in HEAD_LAYERS), None)
    if not isinstance(table, CompactEmbedding) or head is None or layers[head][0] is not table.compact:
        return 0
    layer = view.get_submodule(head.removesuffix(".weight"))
    readable = [(FORMS[name], layout) for name, layout in layer.layouts.items() if FORMS[name].rows is not None]
    if not readable:
        return 0
    form, layout = readable[0]
    name = next(n for n, m in view.named_modules() if m is table)
    view.set_submodule(name, LayoutEmbedding(form.rows(layout), table.compact.shape, dtype=table.dtype))
    held = {storage_id(t) for t in layout if isinstance(t, torch.Tensor)}
    return table.compact.release(shared_storages(view, layers) | held)


def shared_storages(view: nn.Module, layers: dict, *, besides: nn.Module | None = None) -> set[int]:
    """Storages of the tensors the view reads outside its linear layers (a token table tied to the LM
    head, the norms; not counting the module `besides`): a format sharing one of them is not released."""
    inside = tuple(name.removesuffix("weight") for name in layers)
    inside += tuple(f"{name}." for name, m in view.named_modules(remove_duplicate=False) if m is besides)
    named = itertools.chain(view.named_parameters(remove_duplicate=False), view.named_buffers(remove_duplicate=False))
    return {storage_id(t) for name, t in named if not name.startswith(inside)}


def branch_dtype(plan: KernelPlan | None, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the blocks' branches compute in: the activation dtype every block linear's kernels
    take in every phase, when they agree on one no wider than the model's; else the model's."""
    if plan is None:
        return model_dtype
    taken = {KERNELS_BY_NAME[kernel].act_dtype for w in plan.weights.values() if not set(w.layers) & HEAD_LAYERS
             for kernel in w.choices.values()} - {None}  # a kernel that takes any dtype agrees with every one
    if len(taken) == 1 and (dtype := taken.pop()).itemsize <= model_dtype.itemsize:
        return dtype
    return model_dtype


def dense_kernels(view: nn.Module, layers: dict[str, tuple[WeightFormat, torch.Tensor | None]]) -> None:
    """torch's dense products (a GPU's vendor GEMMs): every layer a dense product in the activations'
    dtype (compact formats dequantized once), nothing measured."""
    dtype = view.stack.embed.dtype
    kernel = KERNELS_BY_NAME[{torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]]
    for name, (fmt, bias) in layers.items():
        view.set_submodule(name.removesuffix(".weight"), PlannedLinear.with_kernel(kernel, fmt, bias=bias, dtype=dtype))


def linear_layers(model: nn.Module) -> dict[str, tuple[WeightFormat, torch.Tensor | None]]:
    """{weight name: (format, bias)} of the model's linear layers (nn.Linear or CompactLinear)."""
    out = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, CompactLinear):
            out[f"{name}.weight"] = (module.compact, module.bias)
        elif isinstance(module, nn.Linear):
            out[f"{name}.weight"] = (FloatWeight(module.weight.detach(), label=f"{name}.weight"), module.bias)
    return out


def kernel_summary(plan: KernelPlan | None) -> list[str]:
    """Per phase, the kernels chosen and for how many layers, e.g. 'decode: int4pack x120, int8g/int4x2 x1'."""
    if plan is None:
        return ["every phase: torch's dense products (the torch backend; not measured)"]
    lines = []
    for phase in plan.phases:
        counts: Counter[str] = Counter()
        for w in plan.weights.values():
            if phase.name in w.choices:
                counts[w.choices[phase.name]] += len(w.layers)
        lines.append(f"{phase.name}: " + ", ".join(f"{k} x{n}" for k, n in counts.most_common()))
    return lines


def decode_weight_bytes(plan: KernelPlan | None, view: nn.Module) -> int:
    """Bytes of the layouts a batch-1 decode step reads: every linear layer's decode layout once."""
    if plan is None:  # one dense layout per layer
        return sum(t.nbytes for m in view.modules() if isinstance(m, PlannedLinear)
                   for layout in m.layouts.values() for t in layout if isinstance(t, torch.Tensor))
    total = 0
    for w in plan.weights.values():
        form = KERNELS_BY_NAME[w.choices[w.phases[0]]].form.name
        total += w.form_bytes.get(form, w.nbytes) * len(w.layers)
    return total


def model_id(model: nn.Module) -> str:
    """The plan cache's name for a model: a digest of its config (the plan depends on its shapes)."""
    config = json.dumps(model.config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(config.encode()).hexdigest()[:16]


def _weights_label(formats: dict[str, WeightFormat]) -> str:
    """The formats a model holds, e.g. 'int4+int8g+f32' (part of the plan's cache key)."""
    return "+".join(sorted({fmt.name for fmt in formats.values()}))
