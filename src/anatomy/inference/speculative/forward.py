"""Several tokens through an engine's model in one pass over its static KV cache.

    tokens [B, S] written at cache slots s..s+S-1 -> logits [B, S, V]

Each query row sees exactly what its own decode step would (DecodeSteps.span): the keys at slots
up to its own, so verifying k proposed tokens costs one forward, which reads every weight once,
instead of k. Whatever the cache holds beyond the last slot written (a rejected proposal's keys and
values) is never attended to: the next pass writes over it, so a rewind is only a smaller slot.
"""

from __future__ import annotations

import torch
from torch import Tensor

from anatomy.inference.engine import DecoderEngine
from anatomy.inference.kv_cache import KVCache
from anatomy.inference.steps import DecodeSteps


@torch.inference_mode()
def span_logits(engine: DecoderEngine, tokens: Tensor, start: int, steps: DecodeSteps, cache: KVCache) -> Tensor:
    """tokens [B, S] at cache slots start..start+S-1 -> logits [B, S, V] ."""
    slots = torch.arange(start, start + tokens.shape[1], device=tokens.device)  # [S]
    ctx, positions = steps.span(slots)
    hidden = engine.model.stack.run(tokens, ctx, position_ids=positions, cache=cache)  # [B, S, D]
    return engine.head(hidden)  # [B, S, V]
