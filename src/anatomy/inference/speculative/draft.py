"""Proposals from a draft model: a smaller or cheaper decoder with the target's vocabulary.

The loop's Drafter (serving/drafting.py) runs it over the target's block tables: per round it catches up
on the tokens it has not seen, then proposes k tokens (its argmax, or drawn as the sequence samples).
Any decoder sharing the tokenizer works: a smaller model of the same family, the target's first
few blocks (`first_layers`: self-speculation, sharing the final norm and LM head), or the target
itself with cheaper weights (a float16 copy; an int8/int4 one).
"""

from __future__ import annotations

import copy

from torch import nn

from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine


class DraftProposer:
    """A draft model for SpeculativeDecoder: `engine` proposes, the target verifies."""

    name = "draft"
    free = False

    def __init__(self, engine: DecoderEngine) -> None:
        self.engine = engine


def first_layers(model: nn.Module, n_layers: int) -> nn.Module:
    """Self-speculation's draft: a view of a decoder's first `n_layers` blocks with its own final
    norm and LM head (the same tensors, nothing copied; the model itself is not changed)."""
    config = model.config
    if not config.is_decoder:
        raise InputError(f"a layer-skipping draft needs a decoder model, got architecture={config.architecture!r}")
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or not 1 <= n_layers <= config.n_layers:
        raise InputError(f"draft layers={n_layers!r} must be an integer in [1, {config.n_layers}] "
                         f"(the target has {config.n_layers} blocks)")
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    draft = copy.deepcopy(model, memo=shared)
    draft.stack.blocks = nn.ModuleList(list(draft.stack.blocks)[:n_layers])
    draft.config = draft.stack.config = config.replace(n_layers=n_layers)
    return draft
