"""The engine's own view of a model: new module objects over the caller's tensors.

An engine puts a model in eval mode and swaps its linear layers for the kernels it runs (a split
weight's runs each for its own, and its RMSNorms for one native operator each: kernels/norm.py); doing
that to the caller's model would change it under the caller's feet (its training flag, its module
classes). The view is a structural copy of the module tree whose parameters and buffers are the
caller's own tensors (nothing is copied): the engine changes only its copy.
"""

from __future__ import annotations

import copy
import itertools

from torch import nn

from anatomy.kernels.norm import swap_norms
from anatomy.layers.attention import Attention, check_backend
from anatomy.weights.formats import WeightFormat
from anatomy.weights.modules import split_linears


def engine_view(model: nn.Module, *, attention: str | None = None, native_norms: bool = True) -> nn.Module:
    """A copy of `model`'s modules sharing its parameters and buffers, in eval mode; `attention`
    ("sdpa" or "eager") sets the backend of the copy's attention layers (default: the model's);
    `native_norms` (on a CPU) its RMSNorms run anatomy's operator (not inside torch.compile)."""
    check_held(model)
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    view = copy.deepcopy(model, memo=shared).eval()
    split_linears(view)  # a weight whose row runs keep formats of their own: a layer per run
    if native_norms and next(view.parameters()).device.type == "cpu":
        swap_norms(view)
    if attention is not None:
        check_backend(attention)
        for module in view.modules():
            if isinstance(module, Attention):
                module.backend = attention
    return view


def check_held(model: nn.Module) -> None:
    """InputError when an engine took the model's weights (DecoderEngine(take_weights=True)): its
    formats are empty, and an engine or a draft made of it would compute nothing."""
    for module in model.modules():
        if isinstance(module, WeightFormat):
            module.check_held()
