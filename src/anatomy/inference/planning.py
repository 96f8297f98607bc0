"""The engine's view made fast: each linear layer runs the kernel the measured plan chose for it,
and the activations run in the dtype those kernels take.

    plan, dtype = plan_view(view)      # view: the engine's own copy of the model (inference/view.py)

1. Every linear layer's weight is read as a format (a dense nn.Linear's weight as a FloatWeight view,
   a CompactLinear's as its own format); the LM head sees only the last positions (decode and batch rows).
2. inference.plan measures the candidate kernels on these shapes (once per machine, model shapes
   and weights: then the plan cache answers) and chooses per phase.
3. The activations' dtype follows the chosen decode kernels (most weight bytes decide): bf16 where
   they take bf16 (torch's int4 and int8 kernels, oneDNN), f32 otherwise, never f16 (the residual
   stream's outliers). The view's other float tensors (norms, biases, the token table) are cast to
   it, as its own copies; RoPE's frequencies stay f32 (its angles are made in f32, then cast).
4. Each linear layer becomes a PlannedLinear over its format.

The caller's model is not touched: the view's modules are its own, and every tensor this casts is
a new one put in the view's module.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import torch
from torch import nn

from anatomy.inference.kernels import COMPILABLE_KERNELS, KERNELS, KERNELS_BY_NAME
from anatomy.inference.plan import make_plan
from anatomy.inference.plan_record import KernelPlan
from anatomy.inference.planned_linear import PlannedLinear
from anatomy.layers.position import Rotary
from anatomy.weights.formats import FloatWeight, WeightFormat
from anatomy.weights.modules import CompactEmbedding, CompactLinear

HEAD_PHASES = ("decode", "batch")  # the LM head computes the last position of each row only


def plan_view(view: nn.Module, *, compile: bool = False, cache: bool = True) -> tuple[KernelPlan, torch.dtype]:
    """Measure (or load) the kernel plan of the view's linear layers, swap them for PlannedLinear
    layers and cast the rest of the view to the activations' dtype. Returns (plan, dtype)."""
    layers = linear_layers(view)
    formats = {name: fmt for name, (fmt, _) in layers.items()}
    plan = make_plan(formats, model_id=model_id(view), weights=_weights_label(formats),
                     phases_of={name: HEAD_PHASES for name in layers if name == "lm_head.weight"},
                     kernels=COMPILABLE_KERNELS if compile else KERNELS, cache=cache)
    dtype = activation_dtype(plan, formats)
    cast_dense(view, dtype)
    for name, (fmt, bias) in layers.items():
        view.set_submodule(name.removesuffix(".weight"), PlannedLinear.from_plan(plan, name, fmt, bias=bias, dtype=dtype))
    return plan, dtype


def linear_layers(model: nn.Module) -> dict[str, tuple[WeightFormat, torch.Tensor | None]]:
    """{weight name: (format, bias)} of the model's linear layers (nn.Linear or CompactLinear)."""
    out = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, CompactLinear):
            out[f"{name}.weight"] = (module.compact, module.bias)
        elif isinstance(module, nn.Linear):
            out[f"{name}.weight"] = (FloatWeight(module.weight.detach(), label=f"{name}.weight"), module.bias)
    return out


def activation_dtype(plan: KernelPlan, formats: dict[str, WeightFormat]) -> torch.dtype:
    """bf16 when the decode kernels chosen for most of the weight bytes take bf16, else f32."""
    votes: Counter[torch.dtype] = Counter()
    for name, fmt in formats.items():
        w = plan.for_layer(name)
        phase = w.phases[0]  # the fewest rows: decode
        votes[KERNELS_BY_NAME[w.choices[phase]].act_dtype] += fmt.nbytes
    return torch.bfloat16 if votes and votes.most_common(1)[0][0] == torch.bfloat16 else torch.float32


def cast_dense(view: nn.Module, dtype: torch.dtype) -> None:
    """The view's float parameters and buffers outside its linear layers, as new tensors of `dtype`
    (RoPE's inverse frequencies excepted); a compact token table gives rows of `dtype`."""
    for module in view.modules():
        if isinstance(module, (nn.Linear, CompactLinear, Rotary)):
            continue
        if isinstance(module, CompactEmbedding):
            module.dtype = dtype
            continue
        for table in (module._parameters, module._buffers):
            for key, t in table.items():
                if t is not None and t.is_floating_point() and t.dtype != dtype:
                    cast = t.detach().to(dtype)
                    table[key] = nn.Parameter(cast, requires_grad=False) if isinstance(t, nn.Parameter) else cast


def model_id(model: nn.Module) -> str:
    """The plan cache's name for a model: a digest of its config (the plan depends on its shapes)."""
    config = json.dumps(model.config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(config.encode()).hexdigest()[:16]


def _weights_label(formats: dict[str, WeightFormat]) -> str:
    """The formats a model holds, e.g. 'int4+int8g+f32' (part of the plan's cache key)."""
    return "+".join(sorted({fmt.name for fmt in formats.values()}))
