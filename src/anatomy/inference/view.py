"""The engine's own view of a model: new module objects over the caller's tensors.

An engine puts a model in eval mode and swaps its linear layers for the kernels it runs; doing
that to the caller's model would change it under the caller's feet (its training flag, its module
classes). The view is a structural copy of the module tree whose parameters and buffers are the
caller's own tensors (nothing is copied): the engine changes only its copy.
"""

from __future__ import annotations

import copy
import itertools

from torch import nn


def engine_view(model: nn.Module) -> nn.Module:
    """A copy of `model`'s modules sharing its parameters and buffers, in eval mode."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo=shared).eval()
