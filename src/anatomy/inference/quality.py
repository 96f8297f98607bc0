"""How well a model predicts a text: the mean negative log-likelihood of each token given the
ones before it, from one causal forward. Comparing two ways of running the same weights (fp32
against the engine's planned kernels, say) on the same text tells what the faster one costs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CHUNK = 256  # rows of the LM head at a time: [S, V] logits of a long text would be large


@torch.inference_mode()
def mean_nll(model: nn.Module, ids: list[int]) -> float:
    """Mean of -log p(token_i | tokens_<i) over i = 1..n-1, in nats, for a DecoderLM (or an
    engine's view of one)."""
    x = torch.tensor([ids])  # [1, n]
    hidden = model.stack(x)[0, :-1]  # [n-1, D]: position i predicts token i + 1
    targets = x[0, 1:]
    total = 0.0
    for start in range(0, len(targets), CHUNK):
        logits = model.lm_head(hidden[start:start + CHUNK]).float()  # [c, V]
        total += F.cross_entropy(logits, targets[start:start + CHUNK], reduction="sum").item()
    return total / len(targets)
